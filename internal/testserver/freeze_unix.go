//go:build unix

package testserver

import "syscall"

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
	return s.proc.signal(sig)
}
