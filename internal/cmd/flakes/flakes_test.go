package main

import (
	"bytes"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// run1 is go test -json -shuffle=on output (times left out) of three
// packages: fx/a has a passing test, a failing one, a skipped one and a
// failing subtest; fx/b times out in TestHang with no test failed; fx/c does
// not build.
const run1 = `{"ImportPath":"fx/c [fx/c.test]","Action":"build-output","Output":"# fx/c [fx/c.test]\n"}
{"ImportPath":"fx/c [fx/c.test]","Action":"build-output","Output":"c/c_test.go:5:28: undefined: undefined\n"}
{"ImportPath":"fx/c [fx/c.test]","Action":"build-fail"}
{"Action":"start","Package":"fx/a"}
{"Action":"start","Package":"fx/b"}
{"Action":"output","Package":"fx/a","Output":"-test.shuffle 111\n"}
{"Action":"run","Package":"fx/a","Test":"TestPass"}
{"Action":"output","Package":"fx/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"fx/a","Test":"TestPass","Output":"--- PASS: TestPass (0.00s)\n"}
{"Action":"pass","Package":"fx/a","Test":"TestPass"}
{"Action":"run","Package":"fx/a","Test":"TestSub"}
{"Action":"output","Package":"fx/a","Test":"TestSub","Output":"=== RUN   TestSub\n"}
{"Action":"run","Package":"fx/a","Test":"TestSub/bad"}
{"Action":"output","Package":"fx/a","Test":"TestSub/bad","Output":"=== RUN   TestSub/bad\n"}
{"Action":"output","Package":"fx/a","Test":"TestSub/bad","Output":"    a_test.go:10: sub bad\n"}
{"Action":"output","Package":"fx/a","Test":"TestSub/bad","Output":"--- FAIL: TestSub/bad (0.00s)\n"}
{"Action":"fail","Package":"fx/a","Test":"TestSub/bad"}
{"Action":"output","Package":"fx/a","Test":"TestSub","Output":"--- FAIL: TestSub (0.00s)\n"}
{"Action":"fail","Package":"fx/a","Test":"TestSub"}
{"Action":"run","Package":"fx/a","Test":"TestFail"}
{"Action":"output","Package":"fx/a","Test":"TestFail","Output":"=== RUN   TestFail\n"}
{"Action":"output","Package":"fx/a","Test":"TestFail","Output":"    a_test.go:6: some context\n"}
{"Action":"output","Package":"fx/a","Test":"TestFail","Output":"    a_test.go:6: boom\n"}
{"Action":"output","Package":"fx/a","Test":"TestFail","Output":"--- FAIL: TestFail (0.00s)\n"}
{"Action":"fail","Package":"fx/a","Test":"TestFail"}
{"Action":"run","Package":"fx/a","Test":"TestSkip"}
{"Action":"output","Package":"fx/a","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}
{"Action":"output","Package":"fx/a","Test":"TestSkip","Output":"    a_test.go:7: no server\n"}
{"Action":"output","Package":"fx/a","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}
{"Action":"skip","Package":"fx/a","Test":"TestSkip"}
{"Action":"output","Package":"fx/a","Output":"FAIL\n"}
{"Action":"output","Package":"fx/a","Output":"FAIL\tfx/a\t0.003s\n"}
{"Action":"fail","Package":"fx/a"}
{"Action":"start","Package":"fx/c"}
{"Action":"output","Package":"fx/c","Output":"FAIL\tfx/c [build failed]\n"}
{"Action":"fail","Package":"fx/c","FailedBuild":"fx/c [fx/c.test]"}
{"Action":"output","Package":"fx/b","Output":"-test.shuffle 333\n"}
{"Action":"run","Package":"fx/b","Test":"TestQuick"}
{"Action":"output","Package":"fx/b","Test":"TestQuick","Output":"=== RUN   TestQuick\n"}
{"Action":"output","Package":"fx/b","Test":"TestQuick","Output":"--- PASS: TestQuick (0.00s)\n"}
{"Action":"pass","Package":"fx/b","Test":"TestQuick"}
{"Action":"run","Package":"fx/b","Test":"TestHang"}
{"Action":"output","Package":"fx/b","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"fx/b","Test":"TestHang","Output":"panic: test timed out after 2s\n"}
{"Action":"output","Package":"fx/b","Test":"TestHang","Output":"\trunning tests:\n"}
{"Action":"output","Package":"fx/b","Test":"TestHang","Output":"\t\tTestHang (2s)\n"}
{"Action":"output","Package":"fx/b","Output":"FAIL\tfx/b\t2.006s\n"}
{"Action":"fail","Package":"fx/b"}
`

// run2 is a second run of fx/a and fx/b in which only TestFail fails.
const run2 = `{"Action":"output","Package":"fx/a","Output":"-test.shuffle 222\n"}
{"Action":"run","Package":"fx/a","Test":"TestSub"}
{"Action":"pass","Package":"fx/a","Test":"TestSub"}
{"Action":"run","Package":"fx/a","Test":"TestFail"}
{"Action":"output","Package":"fx/a","Test":"TestFail","Output":"    a_test.go:6: other context\n"}
{"Action":"fail","Package":"fx/a","Test":"TestFail"}
{"Action":"fail","Package":"fx/a"}
{"Action":"output","Package":"fx/b","Output":"-test.shuffle 444\n"}
{"Action":"run","Package":"fx/b","Test":"TestHang"}
{"Action":"pass","Package":"fx/b","Test":"TestHang"}
{"Action":"pass","Package":"fx/b"}
`

func TestParse(t *testing.T) {
	fails, other, err := parse(strings.NewReader(run1 + "not json\n"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fails {
		got = append(got, f.title()+" seed="+f.seed)
	}
	want := []string{
		"fx/a TestSub/bad seed=111", // not TestSub, which failed for it
		"fx/a TestFail seed=111",
		"fx/c [build failed] seed=",
		"fx/b [panic: test timed out after 2s] seed=333",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("parse returned\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(other) != 1 || other[0] != "not json" {
		t.Errorf("other = %q, want [\"not json\"]", other)
	}
}

func TestReport(t *testing.T) {
	var tl tally
	for i, out := range []string{run1, run2, ""} {
		fails, _, err := parse(strings.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		first := tl.add(i+1, fails)
		var titles []string
		for _, f := range first {
			titles = append(titles, f.title())
		}
		// Shown at once under the run: run 2 fails TestFail again only.
		want := map[int]string{0: "fx/a TestSub/bad, fx/a TestFail, fx/c [build failed], fx/b [panic: test timed out after 2s]"}[i]
		if got := strings.Join(titles, ", "); got != want {
			t.Errorf("run %d: first failures %q, want %q", i+1, got, want)
		}
	}
	var b strings.Builder
	tl.report(&b, 3)
	want := `flakes: 2 of 3 runs failed (runs 1, 2)

--- FAIL fx/a TestFail: 2 of 3 runs (run 1 seed 111, run 2 seed 222)
    |     a_test.go:6: some context
    |     a_test.go:6: boom
    | --- FAIL: TestFail (0.00s)

--- FAIL fx/a TestSub/bad: 1 of 3 runs (run 1 seed 111)
    |     a_test.go:10: sub bad
    | --- FAIL: TestSub/bad (0.00s)

--- FAIL fx/c [build failed]: 1 of 3 runs (run 1)
    | # fx/c [fx/c.test]
    | c/c_test.go:5:28: undefined: undefined

--- FAIL fx/b [panic: test timed out after 2s]: 1 of 3 runs (run 1 seed 333)
    | panic: test timed out after 2s
    | 	running tests:
    | 		TestHang (2s)
`
	if b.String() != want {
		t.Errorf("report:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestFind runs the finder on a package of this module that needs no
// server, and on one that does not exist.
func TestFind(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	var b bytes.Buffer
	// No hog here: a busy core for the whole of this test would slow every
	// test running beside it (TestHogStops covers it).
	o := options{n: 2, tail: 5, run: "TestTag|TestCRC16", pkgs: []string{"./internal/slot"}, dir: "../../.."}
	failed, err := find(o, &b)
	if err != nil || failed {
		t.Fatalf("find = %v, %v, want false, nil; output:\n%s", failed, err, &b)
	}
	for _, want := range []string{"\nrun 1/2  ", "  ok\nrun 2/2  ", "flakes: 0 of 2 runs failed\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &b)
		}
	}

	b.Reset()
	o = options{n: 1, tail: 5, pkgs: []string{"./internal/nosuch"}, dir: "../../.."}
	failed, err = find(o, &b)
	if err != nil || !failed {
		t.Fatalf("find = %v, %v, want true, nil; output:\n%s", failed, err, &b)
	}
	if want := "--- FAIL ./internal/nosuch [build failed]: 1 of 1 runs (run 1)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, &b)
	}
}

// TestHogStops starts a spinning goroutine and checks that stop ends it:
// stop returns once the spinner has left its loop.
func TestHogStops(t *testing.T) {
	before := runtime.NumGoroutine()
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)
	stop := hog(1)
	if runtime.GOMAXPROCS(0) < 2 {
		t.Errorf("GOMAXPROCS = %d with one core kept busy, want at least 2 (one for the finder)", runtime.GOMAXPROCS(0))
	}
	if n := runtime.NumGoroutine(); n != before+1 {
		t.Errorf("%d goroutines while one core is kept busy, want %d", n, before+1)
	}
	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not return within 10 s: the spinner did not end")
	}
}

func TestSaveKeepsTheWholeOutput(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	f := failure{pkg: "fx/a", name: "TestFail", lines: []string{"first", "second"}}
	path, err := f.save()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "first\nsecond\n" {
		t.Errorf("saved %q, want every line", got)
	}
}
