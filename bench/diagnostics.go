package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"time"
)

// startCPUProfile profiles the process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating the CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting the CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// writeAllocProfile writes the profile of every allocation since the
// process started to path; a failure is reported on progress, since the
// run's figures stand without it.
func writeAllocProfile(path string, progress io.Writer) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(progress, "warning: writing the allocation profile: %v\n", err)
	}
}

// waitForGoroutines waits until no more than want goroutines run, and
// returns "" or a description of the ones left over.
func waitForGoroutines(want int, limit time.Duration) string {
	deadline := time.Now().Add(limit)
	for runtime.NumGoroutine() > want {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Sprintf("%d goroutines still running %s after the last run (%d before the first):\n%s",
				runtime.NumGoroutine(), limit, want, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ""
}
