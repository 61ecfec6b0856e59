//go:build linux

package main

import (
	"errors"
	"os"
	"syscall"
)

// serverProcAttr makes the private server, or a consuming child, die with
// this program, even when it is killed before it can stop them itself.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// peakRSS is the maximum resident set size of an exited process, in bytes
// (Linux reports it in KiB).
func peakRSS(ps *os.ProcessState) (int64, error) {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return 0, errors.New("the kernel did not report the child's resident memory")
	}
	return ru.Maxrss << 10, nil
}
