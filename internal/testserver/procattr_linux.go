//go:build linux

package testserver

import "syscall"

// sysProcAttr makes the server die together with the test binary.
//
// Pdeathsig is delivered when the OS thread that started the child exits;
// the Go runtime only terminates threads whose goroutine exited while
// locked with runtime.LockOSThread, which this package never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
