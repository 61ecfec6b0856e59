//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// serverProcAttr makes the private server, or a consuming child, die with
// this program, even when it is killed before it can stop them itself.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// ownPeakRSS is this process's peak resident set size, in bytes: VmHWM of
// /proc/self/status. The rusage of an exited child would not do: Linux
// counts in it the memory of the parent it was started from, whose address
// space the child shares until it execs, so a child of a large parent
// reports the parent's size.
func ownPeakRSS() (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		rest, ok := strings.CutPrefix(line, "VmHWM:")
		if !ok {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("reading VmHWM %q: %w", rest, err)
		}
		return kib << 10, nil
	}
	return 0, errors.New("/proc/self/status has no VmHWM")
}
