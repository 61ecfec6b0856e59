// Command flakes runs the tests several times to find the ones that fail
// only now and then. Run it from the module root before a submission:
//
//	go run ./internal/cmd/flakes [-n runs] [-hog cores] [-run regexp] [-tags list] [-timeout d] [-tail lines] [packages]
//
// Without packages, each run is the README's test command (see
// internal/cmd/tests): go test -race -count=1 -parallel 8 ./... and the same
// (without -parallel 8) in the compat and examples modules, side by side.
// With packages,
// each run is go test -race -count=1 -parallel 8 on those packages of this
// module. -run, -tags and -timeout are passed to every go test. Every go
// test gets -shuffle=on, so each run orders the tests of each package
// differently, and -json, which the finder reads the results from. The
// environment is passed on: VALKEYSTREAM_TEST_SERVER=valkey-server picks the
// server the tests start.
//
// -hog K keeps K goroutines spinning (K cores busy) while the runs go on,
// as a loaded machine would, and stops them at the end.
//
// The finder prints each run's duration and result (and, under it, how a
// test that failed for the first time failed: its command again, its
// output's last lines, and a file in the temporary directory that holds
// all of it), then, at the end, every test that failed: its package and
// full name, in how many runs it failed, the -test.shuffle seed of each of
// those runs, a go test command that runs its package again in the same
// order, and the last lines of its first failing output (from the panic or
// data race report, if there is one). A package
// that did not build, or that failed with no failing test (a panic outside a
// test, "panic: test timed out", TestMain's exit status), is reported as a
// failure of the package (a package that does not exist is one that did not
// build), and a go test that failed with neither (a broken go.mod, a killed
// go test) as a failure of that go test, with its standard error.
//
// The exit status is 1 if a run failed, 2 on wrong usage or if go could not
// be started.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/echomq/valkeystream/internal/testcmd"
)

// options are the finder's flags.
type options struct {
	n       int    // runs
	hog     int    // cores kept busy
	tail    int    // output lines shown per failure
	run     string // go test -run
	tags    string // go test -tags
	timeout string // go test -timeout
	pkgs    []string
	dir     string // where go test runs: the module root
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 5, "number of runs")
	flag.IntVar(&o.hog, "hog", 0, "cores to keep busy with spinning goroutines during the runs")
	flag.IntVar(&o.tail, "tail", 20, "lines of output shown for each failure")
	flag.StringVar(&o.run, "run", "", "go test -run `regexp`")
	flag.StringVar(&o.tags, "tags", "", "go test -tags `list`")
	flag.StringVar(&o.timeout, "timeout", "", "go test -timeout `duration`")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go run ./internal/cmd/flakes [flags] [packages]")
		flag.PrintDefaults()
	}
	flag.Parse()
	o.pkgs, o.dir = flag.Args(), "."
	failed, err := find(o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flakes:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// steps returns the go test invocations of one run: the test command's,
// or one of this module's packages.
func (o options) steps() []testcmd.Step {
	if len(o.pkgs) > 0 {
		return []testcmd.Step{{Args: testcmd.Own(), Pkgs: o.pkgs}}
	}
	return testcmd.Steps()
}

// command returns s's go arguments with -shuffle=shuffle and the flags o
// passes on, for pkgs.
func (o options) command(s testcmd.Step, shuffle string, pkgs ...string) []string {
	flags := []string{"-shuffle=" + shuffle}
	for _, f := range []struct{ name, value string }{{"-run", o.run}, {"-tags", o.tags}, {"-timeout", o.timeout}} {
		if f.value != "" {
			flags = append(flags, f.name, f.value)
		}
	}
	return testcmd.Step{Args: s.Args, Pkgs: pkgs}.Command(flags...)
}

// find makes o.n runs, writes their results and the summary to w, and
// reports whether a run failed.
func find(o options, w io.Writer) (bool, error) {
	if o.n < 1 {
		return false, errors.New("-n must be at least 1")
	}
	var cmds []string
	for _, s := range o.steps() {
		cmds = append(cmds, shell(o.command(s, "on", s.Pkgs...)))
	}
	fmt.Fprintf(w, "flakes: running %d times, side by side: %s", o.n, strings.Join(cmds, " & "))
	if o.hog > 0 {
		fmt.Fprintf(w, ", cores kept busy: %d", o.hog)
	}
	fmt.Fprintln(w)
	defer hog(o.hog)()

	var t tally
	for run := 1; run <= o.n; run++ {
		start := time.Now()
		fails, err := o.runSteps()
		if err != nil {
			return false, err
		}
		first := t.add(run, fails)
		result := "ok"
		if len(fails) > 0 {
			titles := make([]string, len(fails))
			for i, f := range fails {
				titles[i] = f.title()
			}
			result = fmt.Sprintf("FAIL (%d): %s", len(fails), strings.Join(titles, ", "))
		}
		fmt.Fprintf(w, "run %d/%d  %v  %s\n", run, o.n, time.Since(start).Round(100*time.Millisecond), result)
		// A failure seen for the first time is shown at once, so that a
		// long series need not end before one can look into it.
		for _, f := range first {
			fmt.Fprintf(w, "--- FAIL %s (run %d, first seen)\n", f.title(), run)
			f.show(w, o.tail)
			if path, err := f.save(); err == nil {
				fmt.Fprintf(w, "    whole output: %s\n", path)
			}
		}
	}
	fmt.Fprintln(w)
	t.report(w, o.tail)
	return len(t.failed) > 0, nil
}

// runSteps runs the steps of one run side by side, as the test command
// does, and returns what failed in them, in the order of the steps.
func (o options) runSteps() ([]failure, error) {
	steps := o.steps()
	fails := make([][]failure, len(steps))
	errs := make([]error, len(steps))
	var wg sync.WaitGroup
	for i, s := range steps {
		wg.Go(func() { fails[i], errs[i] = o.test(s) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var all []failure
	for _, f := range fails {
		all = append(all, f...)
	}
	return all, nil
}

// test runs one go test and returns what failed in it. The error is go's
// failing to start.
func (o options) test(s testcmd.Step) ([]failure, error) {
	cmd := exec.Command("go", o.command(s, "on", append([]string{"-json"}, s.Pkgs...)...)...)
	cmd.Dir = o.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting go test: %w", err)
	}
	fails, other, perr := parse(stdout)
	_, _ = io.Copy(io.Discard, stdout) // the rest, if parse stopped early
	werr := cmd.Wait()
	for i, f := range fails {
		if f.seed != "" {
			fails[i].rerun = shell(o.command(s, f.seed, f.pkg))
		}
	}
	if (werr != nil && len(fails) == 0) || perr != nil {
		// Nothing in the output explains the exit status: go test could
		// not list or set up the packages, or was killed.
		lines := append(other, strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")...)
		note := fmt.Sprint(werr)
		if perr != nil {
			note = "reading its -json output: " + perr.Error()
		}
		fails = append(fails, failure{pkg: shell(s.Args), note: note, lines: lines})
	}
	return fails, nil
}

// shell writes the go command with args as a shell would read it.
func shell(args []string) string {
	s := "go"
	for _, a := range args {
		if a == "" || strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./,:") != "" {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		s += " " + a
	}
	return s
}

// hog keeps k goroutines spinning, each on a core of its own, until the
// returned stop is called, which waits for them to end.
func hog(k int) (stop func()) {
	if k <= 0 {
		return func() {}
	}
	if runtime.GOMAXPROCS(0) <= k {
		runtime.GOMAXPROCS(k + 1) // and one for the finder itself
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			for !done.Load() {
			}
		})
	}
	return func() {
		done.Store(true)
		wg.Wait()
	}
}
