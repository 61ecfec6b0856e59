// Command tests runs every test of the project: the README's test command.
// From the module root:
//
//	go run ./internal/cmd/tests [go test flags]
//
// It runs, side by side, go test -race -count=1 -parallel 8 ./... in this
// module and go test -race -count=1 ./... in the compat and examples modules
// (modules of their own, which ./... does not descend into), with its own
// arguments (-run, -v, -shuffle=on, ...) passed to each. Side by side, the
// two smaller modules, which mostly wait on their servers and processes,
// take no time of their own. This module's output is shown as it comes,
// each other module's once it has ended and this module's has, so that
// outputs never interleave; then a line per go test with its result and
// duration. The exit status is 1 if one of them failed, 2 if go could not
// be started.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/echomq/valkeystream/internal/testcmd"
)

func main() {
	os.Exit(run(testcmd.Steps(), os.Args[1:], os.Stdout, os.Stderr))
}

// result is how one go test ended.
type result struct {
	cmd  string
	err  error // of Wait; nil if it passed
	took time.Duration
	out  *bytes.Buffer // its output, when it is not streamed
}

// run runs steps side by side with flags, writes their outputs to stdout
// (the first as it comes, each other one once it and those before it have
// ended) and go's failures to start to stderr, and returns the exit status.
func run(steps []testcmd.Step, flags []string, stdout, stderr io.Writer) int {
	results := make([]chan result, len(steps))
	for i, s := range steps {
		args := s.Command(flags...)
		cmd := exec.Command("go", args...)
		r := result{cmd: "go " + strings.Join(args, " ")}
		if i == 0 {
			cmd.Stdout, cmd.Stderr = stdout, stdout
		} else {
			r.out = &bytes.Buffer{}
			cmd.Stdout, cmd.Stderr = r.out, r.out
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(stderr, "tests: starting %s: %v\n", r.cmd, err)
			return 2
		}
		results[i] = make(chan result, 1)
		go func() {
			r.err = cmd.Wait()
			r.took = time.Since(start)
			results[i] <- r
		}()
	}
	var ended []result
	for i, c := range results {
		r := <-c
		if i > 0 {
			fmt.Fprintf(stdout, "=== %s\n", r.cmd)
			_, _ = r.out.WriteTo(stdout)
		}
		ended = append(ended, r)
	}
	status := 0
	fmt.Fprintln(stdout)
	for _, r := range ended {
		verdict := "passed"
		if r.err != nil {
			verdict, status = "FAILED", 1
			var exit *exec.ExitError
			if !errors.As(r.err, &exit) {
				verdict += " (" + r.err.Error() + ")"
			}
		}
		fmt.Fprintf(stdout, "%-6s %s (%s)\n", verdict, r.cmd, r.took.Round(time.Second))
	}
	return status
}
