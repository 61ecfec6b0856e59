package testserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one run of the private server process.
type proc struct {
	cmd *exec.Cmd
	// supervised: restart the process if it exits while wanted up. Set from
	// the start for replacements started by the supervisor, and once the
	// process answered PING for processes started by Start/StartAgain (so
	// a server that cannot start at all fails fast instead of looping).
	supervised bool          // guarded by supervisor.mu
	ready      bool          // answered PING at least once; guarded by supervisor.mu
	done       chan struct{} // closed once the supervisor has handled the exit
	exitErr    error         // result of Wait; read only after done is closed
	logFrom    int64         // size of the server's log when it started
}

// supervisor runs a private server process: it starts it, restarts it when
// it exits unless that was wanted (Kill, shutdown), signals and kills it.
// Its methods are safe for concurrent use.
type supervisor struct {
	spec   procSpec // port fixed once startProcess returns
	log    *testLog
	ctx    context.Context // ends at shutdown
	cancel context.CancelFunc
	wg     sync.WaitGroup // one goroutine per process run

	mu         sync.Mutex
	cur        *proc // current (possibly exited, not yet reaped) process
	wantUp     bool  // false after Kill/shutdown: do not restart
	closed     bool
	quickFails int
}

// startProcess creates the directory and starts the first server process.
func startProcess(bin string, t testing.TB, mode procConfig) (*Server, error) {
	dir, err := os.MkdirTemp("", "valkeystream-testserver-")
	if err != nil {
		return nil, fmt.Errorf("create server directory: %w", err)
	}
	log := newTestLog(t)
	sup := &supervisor{spec: procSpec{bin: bin, dir: dir, mode: mode}, log: log}
	if mode.sentinel != "" {
		if err := os.WriteFile(sup.spec.sentinelConf(), []byte(mode.sentinel), 0o644); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("write sentinel.conf: %w", err)
		}
	}
	sup.ctx, sup.cancel = context.WithCancel(context.Background())

	// The free port may be taken by someone else before the server binds
	// it; try a few ports.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		// No supervisor goroutine runs here (see the wg.Wait below), so
		// the port can be set without the mutex.
		sup.spec.port = port
		if lastErr = sup.start(); lastErr == nil {
			break
		}
		_ = sup.kill()
		sup.wg.Wait()
	}
	s := &Server{kind: kindProcess, addr: sup.spec.addr(), port: sup.spec.port, proc: sup, log: log}
	if lastErr == nil {
		lastErr = s.loadInfo()
	}
	if lastErr != nil {
		sup.shutdown()
		return nil, fmt.Errorf("start %s: %w", bin, lastErr)
	}
	return s, nil
}

// startLocked starts a server process and its supervisor goroutine. s.mu
// must be held, s.cur must be nil or exited, and s.closed false.
func (s *supervisor) startLocked(supervised bool) (*proc, error) {
	logFrom := s.spec.logSize()
	cmd := exec.Command(s.spec.bin, s.spec.args()...)
	cmd.Dir = s.spec.dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", s.spec.bin, err)
	}
	if err := writeFileAtomic(s.spec.pidFile(), []byte(strconv.Itoa(cmd.Process.Pid)+"\n")); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("write pid file: %w", err)
	}
	p := &proc{cmd: cmd, supervised: supervised, done: make(chan struct{}), logFrom: logFrom}
	s.cur = p
	s.wg.Add(1)
	go s.supervise(p)
	return p, nil
}

// supervise waits for p to exit and, unless the exit was deliberate (Kill,
// shutdown), starts a replacement on the same port and directory.
func (s *supervisor) supervise(p *proc) {
	defer s.wg.Done()
	waitErr := p.cmd.Wait()
	pid := p.cmd.Process.Pid
	p.exitErr = waitErr
	addr := s.spec.addr()

	s.mu.Lock()
	if s.cur == p {
		_ = os.Remove(s.spec.pidFile())
	}
	report := s.spec.crashReport(p.logFrom)
	if s.cur != p || !s.wantUp || s.closed || !p.supervised {
		if report != "" && !s.closed {
			// It crashed by itself as the test stopped it (Kill).
			s.log.failf("testserver: server pid %d crashed (%v) while the test ran%s", pid, waitErr, report)
		}
		s.releaseLocked(p)
		s.mu.Unlock()
		return
	}
	if p.ready || killedBySIGKILL(waitErr) {
		// A working server killed from outside (RestartCommand, a test,
		// the OOM killer): restart it, however often that happens.
		s.quickFails = 0
	} else {
		// It failed by itself before answering PING: retry with a backoff
		// but not forever.
		s.quickFails++
	}
	fails := s.quickFails
	if fails > maxQuickFails {
		s.wantUp = false
		s.releaseLocked(p)
		s.mu.Unlock()
		s.log.printf("testserver: server pid %d exited (%v); giving up after %d failed restarts%s",
			pid, waitErr, fails-1, s.spec.logTail())
		return
	}
	s.mu.Unlock()

	if p.ready && (report != "" || !killedBySIGKILL(waitErr)) {
		// Nothing here stops a server but SIGKILL: one that exited
		// otherwise, or printed a bug report, crashed by itself, and what
		// the test sent it may be the cause.
		s.log.failf("testserver: server pid %d crashed (%v) while the test ran; restarting on %s%s", pid, waitErr, addr, report)
	} else {
		s.log.printf("testserver: server pid %d exited unexpectedly (%v); restarting on %s", pid, waitErr, addr)
	}
	if fails > 1 {
		backoff := min(time.Duration(fails-1)*100*time.Millisecond, time.Second)
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
		}
	}

	s.mu.Lock()
	if s.cur != p || !s.wantUp || s.closed {
		s.releaseLocked(p)
		s.mu.Unlock()
		return
	}
	np, err := s.startLocked(true)
	if err != nil {
		s.wantUp = false
		s.releaseLocked(p)
		s.mu.Unlock()
		s.log.printf("testserver: restart failed: %v", err)
		return
	}
	close(p.done)
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(s.ctx, restartReadyTimeout)
	defer cancel()
	if err := waitPing(ctx, addr, np.cmd.Process.Pid, np.done); err != nil {
		select {
		case <-np.done:
			// It exited again (e.g. killed by the next RestartCommand);
			// its own supervisor reports that.
		default:
			if s.ctx.Err() == nil {
				s.log.printf("testserver: restarted server pid %d: %v%s", np.cmd.Process.Pid, err, s.spec.logTail())
			}
		}
		return
	}
	s.mu.Lock()
	np.ready = true
	s.mu.Unlock()
	s.log.printf("testserver: restarted server on %s, pid %d", addr, np.cmd.Process.Pid)
}

// killedBySIGKILL reports whether err, from exec.Cmd.Wait, says that the
// process was killed with SIGKILL.
func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// releaseLocked forgets the exited process p and wakes its waiters.
// s.mu must be held.
func (s *supervisor) releaseLocked(p *proc) {
	if s.cur == p {
		s.cur = nil
	}
	close(p.done)
}

// kill stops the server for good (until start).
func (s *supervisor) kill() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	// With wantUp false no supervisor starts a new process, so s.cur is
	// the only process that can be running.
	s.wantUp = false
	p := s.cur
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill server pid %d: %w", p.cmd.Process.Pid, err)
	}
	<-p.done
	return nil
}

// start starts the server unless it is already running, and waits until
// it answers PING.
func (s *supervisor) start() error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return errClosed
		}
		if p := s.cur; p != nil {
			if s.wantUp {
				// Already running (or being restarted by the supervisor).
				s.mu.Unlock()
				return s.waitReady(p)
			}
			// Being killed: wait until it is gone, then start anew.
			s.mu.Unlock()
			<-p.done
			continue
		}
		s.wantUp = true
		s.quickFails = 0
		p, err := s.startLocked(false)
		s.mu.Unlock()
		if err != nil {
			return err
		}
		return s.waitReady(p)
	}
}

// waitReady waits until the server answers PING, and marks p supervised.
// It fails early if p exits before answering.
func (s *supervisor) waitReady(p *proc) error {
	ctx, cancel := context.WithTimeout(s.ctx, readyTimeout)
	defer cancel()
	s.mu.Lock()
	var stop <-chan struct{}
	if !p.supervised {
		// A supervised process is replaced when it exits; keep waiting.
		stop = p.done
	}
	s.mu.Unlock()
	addr := s.spec.addr()
	if err := waitPing(ctx, addr, p.cmd.Process.Pid, stop); err != nil {
		select {
		case <-stop:
			return fmt.Errorf("server process exited before answering PING on %s (%v)%s", addr, p.exitErr, s.spec.logTail())
		default:
			return fmt.Errorf("%w%s", err, s.spec.logTail())
		}
	}
	s.mu.Lock()
	p.supervised = true
	p.ready = true
	s.mu.Unlock()
	return nil
}

// alive reports whether the process is wanted up.
func (s *supervisor) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wantUp && !s.closed
}

// signal sends sig to the running process.
func (s *supervisor) signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.cur == nil {
		return fmt.Errorf("testserver: %s: no server process running", s.spec.addr())
	}
	if err := s.cur.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("testserver: signal %v to pid %d: %w", sig, s.cur.cmd.Process.Pid, err)
	}
	return nil
}

// shutdown kills the server, waits for the supervisor goroutines and
// removes the directory.
func (s *supervisor) shutdown() {
	s.mu.Lock()
	s.closed = true
	s.wantUp = false
	p := s.cur
	s.mu.Unlock()
	s.cancel()
	if p != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	s.wg.Wait()
	if err := os.RemoveAll(s.spec.dir); err != nil {
		s.log.printf("testserver: remove %s: %v", s.spec.dir, err)
	}
}

// writeFileAtomic writes data to a temporary file and renames it over path,
// so readers (the RestartCommand script) never see a partial file.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
