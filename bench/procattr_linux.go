//go:build linux

package main

import "syscall"

// serverProcAttr makes the private server die with this program, even when
// it is killed before it can stop the server itself.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
