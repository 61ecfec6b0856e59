//go:build !linux

package testserver

import "syscall"

// sysProcAttr returns nil: Pdeathsig is only available on Linux, so on
// other systems the server is only killed by the test's cleanup.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}
