//go:build !linux

package main

import "syscall"

// serverProcAttr: elsewhere the server is only stopped by stop.
func serverProcAttr() *syscall.SysProcAttr { return nil }
