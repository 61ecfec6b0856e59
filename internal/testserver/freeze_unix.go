//go:build unix

package testserver

import (
	"fmt"
	"syscall"
)

// Freeze stops the private server process with SIGSTOP: its connections
// stay open but it answers nothing, replicates nothing and acknowledges
// nothing until Thaw. A frozen process is still killed by the cleanup.
func (s *Server) Freeze() error { return s.signal(syscall.SIGSTOP) }

// Thaw resumes a process stopped by Freeze (SIGCONT).
func (s *Server) Thaw() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.kind != kindProcess {
		return errNotRestartable
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.cur == nil {
		return fmt.Errorf("testserver: %s: no server process running", s.addr)
	}
	if err := s.cur.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("testserver: signal %v to pid %d: %w", sig, s.cur.cmd.Process.Pid, err)
	}
	return nil
}
