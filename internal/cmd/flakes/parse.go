package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
)

// event is one line of go test -json (see "go doc test2json"), with the
// fields the finder reads. A build's output comes in "build-output" events
// keyed by ImportPath, and a package that did not build ends with a "fail"
// event whose FailedBuild names what failed to build.
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
}

// failure is one test, or one package, that failed in one go test
// invocation.
type failure struct {
	pkg   string   // import path (or, for a go test that failed alone, its command)
	name  string   // the test's full name; "" for the package itself
	note  string   // for a package: why it failed
	seed  string   // the package's -test.shuffle seed; "" if no test binary ran
	lines []string // its output, or the package's for a package failure
	rerun string   // a command that runs the package again in the same order
}

// title names the failure in the report.
func (f failure) title() string {
	if f.name != "" {
		return f.pkg + " " + f.name
	}
	return f.pkg + " [" + f.note + "]"
}

// pkgState is what parse keeps of a package while its events come in.
type pkgState struct {
	seed    string
	out     []string            // package-level output
	running map[string][]string // output of each test started and not ended
	started []string            // test names in the order they started
	failed  int                 // tests that failed
}

// parse reads the -json output of one go test invocation and returns, in
// the order go test ended them, the tests that failed in it, and the lines
// that were not JSON.
//
// A test that failed only because a subtest did is left out: the subtest is
// the failure. A package is a failure of its own (name "") when it did not
// build, or when it failed with no failing test or with tests that never
// ended: a panic outside a test, a timeout ("panic: test timed out"),
// TestMain's exit status.
func parse(in io.Reader) (fails []failure, other []string, err error) {
	pkgs := map[string]*pkgState{}
	build := map[string][]string{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		var e event
		if line := sc.Bytes(); len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			other = append(other, sc.Text())
			continue
		}
		out := strings.TrimSuffix(e.Output, "\n")
		if e.Action == "build-output" {
			build[e.ImportPath] = append(build[e.ImportPath], out)
			continue
		}
		if e.Package == "" {
			continue
		}
		p := pkgs[e.Package]
		if p == nil {
			p = &pkgState{running: map[string][]string{}}
			pkgs[e.Package] = p
		}
		if e.Test == "" {
			switch e.Action {
			case "output":
				if s, ok := strings.CutPrefix(out, "-test.shuffle "); ok {
					p.seed = s
				}
				p.out = append(p.out, out)
			case "fail":
				if f, ok := p.failure(e, build); ok {
					fails = append(fails, f)
				}
				delete(pkgs, e.Package)
			}
			continue
		}
		switch e.Action {
		case "run":
			p.running[e.Test] = nil
			p.started = append(p.started, e.Test)
		case "output":
			if lines, ok := p.running[e.Test]; ok {
				p.running[e.Test] = append(lines, out)
			} else {
				p.out = append(p.out, out)
			}
		case "pass", "skip":
			delete(p.running, e.Test)
		case "fail":
			p.failed++
			if !failedSubtest(fails, e.Package, e.Test) {
				fails = append(fails, failure{pkg: e.Package, name: e.Test, seed: p.seed, lines: p.running[e.Test]})
			}
			delete(p.running, e.Test)
		}
	}
	return fails, other, sc.Err()
}

// failure returns the failure of the package itself, if its "fail" event e
// is not explained by its failing tests.
func (p *pkgState) failure(e event, build map[string][]string) (failure, bool) {
	f := failure{pkg: e.Package, seed: p.seed}
	if e.FailedBuild != "" {
		f.note, f.lines = "build failed", build[e.FailedBuild]
		return f, true
	}
	if p.failed > 0 && len(p.running) == 0 {
		return f, false
	}
	f.lines = p.out
	var left []string
	for _, t := range p.started {
		if lines, ok := p.running[t]; ok {
			f.lines = append(f.lines, lines...)
			left = append(left, t)
		}
	}
	switch {
	case cause(f.lines) >= 0:
		f.note = f.lines[cause(f.lines)]
	case len(left) > 0:
		f.note = "tests never ended: " + strings.Join(left, ", ")
	default:
		f.note = "failed without a failing test"
	}
	return f, true
}

// failedSubtest reports whether fails holds a subtest of test in pkg.
func failedSubtest(fails []failure, pkg, test string) bool {
	for _, f := range fails {
		if f.pkg == pkg && strings.HasPrefix(f.name, test+"/") {
			return true
		}
	}
	return false
}

// cause returns the index of the first line that starts a panic, a fatal
// runtime error or a data race report, or -1.
func cause(lines []string) int {
	for i, l := range lines {
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") || l == "WARNING: DATA RACE" {
			return i
		}
	}
	return -1
}

// excerpt returns at most n lines of a failure's output without go test's
// "=== RUN" (PAUSE, CONT, NAME) lines: from the first line cause finds, or
// else the last n.
func excerpt(lines []string, n int) []string {
	var kept []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "=== ") {
			kept = append(kept, l)
		}
	}
	if i := cause(kept); i >= 0 {
		return kept[i:min(len(kept), i+n)]
	}
	return kept[max(0, len(kept)-n):]
}
