package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/echomq/valkeystream/internal/testcmd"
)

// Steps of go commands that need no build: go env prints a variable, go
// nosuch fails.
var (
	env    = testcmd.Step{Args: []string{"env"}, Pkgs: []string{"GOOS"}}
	failed = testcmd.Step{Args: []string{"nosuch"}}
)

func TestEveryStepRunsAndEachOutputIsWhole(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]testcmd.Step{env, failed, env}, nil, &out, &errOut); code != 1 {
		t.Fatalf("exit status %d, want 1 (a step failed); output:\n%s", code, &out)
	}
	want := regexp.MustCompile(`(?s)^\w+\n` + // the first step's output, as it came
		`=== go nosuch\n.*unknown command.*\n` +
		`=== go env GOOS\n\w+\n\n` +
		`passed go env GOOS \(\d+s\)\nFAILED go nosuch \(\d+s\)\npassed go env GOOS \(\d+s\)\n$`)
	if !want.MatchString(out.String()) {
		t.Errorf("output:\n%s\ndoes not match %s", &out, want)
	}
	if errOut.Len() > 0 {
		t.Errorf("standard error: %s", &errOut)
	}
}

func TestFlagsGoBeforeThePackages(t *testing.T) {
	var out bytes.Buffer
	s := testcmd.Step{Args: []string{"env"}, Pkgs: []string{"GOARCH"}}
	if code := run([]testcmd.Step{s}, []string{"GOOS"}, &out, &out); code != 0 {
		t.Fatalf("exit status %d; output:\n%s", code, &out)
	}
	if !strings.Contains(out.String(), "passed go env GOOS GOARCH (") {
		t.Errorf("output:\n%s\nlacks the command with the flags before the packages", &out)
	}
}

func TestAPassingRunExitsZero(t *testing.T) {
	var out bytes.Buffer
	if code := run([]testcmd.Step{env, env}, nil, &out, &out); code != 0 {
		t.Fatalf("exit status %d, want 0; output:\n%s", code, &out)
	}
}
