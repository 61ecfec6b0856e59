//go:build !linux

package main

import "syscall"

// serverProcAttr: elsewhere the server is only stopped by stop.
func serverProcAttr() *syscall.SysProcAttr { return nil }

// ownPeakRSS: measured on Linux only; 0 is reported as not measured.
func ownPeakRSS() (int64, error) { return 0, nil }
