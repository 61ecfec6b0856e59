package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is an example's binary running as a child process of a test.
type Process struct {
	Name   string      // what the test's messages call it, e.g. "worker w1"
	Cmd    *exec.Cmd   // started by StartProcess
	Output *SyncBuffer // its stdout and stderr
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// StartProcess starts cmd, its stdout and stderr going to the Process'
// Output. When the test ends the process is killed if it still runs, and
// its output logged if the test failed.
func StartProcess(t testing.TB, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{Name: name, Cmd: cmd, Output: &SyncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Output, p.Output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s (pid %d) output:\n%s", p.Name, cmd.Process.Pid, p.Output.String())
		}
	})
	return p
}

// CheckRunning fails the test if the process exited.
func (p *Process) CheckRunning(t testing.TB) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("%s exited (%v):\n%s", p.Name, p.err, p.Output.String())
	default:
	}
}

// Kill SIGKILLs the process and waits for it to end.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	t.Logf("%s (pid %d) killed", p.Name, p.Cmd.Process.Pid)
}

// Stop sends SIGTERM and checks that the process shuts down cleanly within
// timeout: it exits with status 0 (in a race build, a race report would
// make it exit with status 66) and its own last line ends "stopped" (see
// stoppedLast).
func (p *Process) Stop(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(timeout):
		t.Fatalf("%s did not stop within %s of SIGTERM:\n%s", p.Name, timeout, p.Output.String())
	}
	if p.err != nil || !stoppedLast(p.Output.String()) {
		t.Fatalf("%s did not stop cleanly (%v):\n%s", p.Name, p.err, p.Output.String())
	}
}

// stoppedLast reports whether the last line of output that is not
// go-redis' own ("redis: ...", which its pool may log as the client
// closes) ends "stopped".
func stoppedLast(output string) bool {
	lines := strings.Split(strings.TrimSpace(output), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(line, "redis: ") {
			return strings.HasSuffix(line, "stopped")
		}
	}
	return false
}

// SyncBuffer is a bytes.Buffer safe for the writes of a child process'
// stdout and stderr and the test's reads.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Setting is a setting an example takes from a flag or from an environment
// variable.
type Setting struct {
	Flag  string // e.g. "-addr"
	Env   string // e.g. "VALKEYSTREAM_ADDR"
	Value string
}

// Command returns the command that runs bin with args and the settings,
// given as environment variables when byEnv is set, else as flags. Either
// way the settings' variables the test inherited are cleared.
func Command(bin string, args []string, byEnv bool, settings ...Setting) *exec.Cmd {
	env := os.Environ()
	for _, s := range settings {
		env = append(env, s.Env+"=")
	}
	for _, s := range settings {
		if byEnv {
			env = append(env, s.Env+"="+s.Value)
		} else {
			args = append(args, s.Flag, s.Value)
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	return cmd
}
