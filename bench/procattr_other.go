//go:build !linux

package main

import (
	"os"
	"syscall"
)

// serverProcAttr: elsewhere the server is only stopped by stop.
func serverProcAttr() *syscall.SysProcAttr { return nil }

// peakRSS: measured on Linux only; 0 is reported as not measured.
func peakRSS(*os.ProcessState) (int64, error) { return 0, nil }
