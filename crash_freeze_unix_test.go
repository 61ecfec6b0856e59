//go:build unix

package valkeystream_test

import (
	"os"
	"syscall"
)

// crashStop and crashCont stop and resume a worker process (the freezes of
// the transform crash audit).
func crashStop(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func crashCont(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

const crashCanFreeze = true
