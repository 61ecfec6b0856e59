package main

import (
	"bufio"
	"os"
	"runtime"
	"strings"
)

// machine describes where the benchmark ran.
type machine struct {
	cpu        string
	cores      int
	gomaxprocs int
	os         string
	goVersion  string
	loadStart  string // load averages (1, 5, 15 min) when the run began
	loadEnd    string // ... and when it ended
}

func describeMachine() machine {
	return machine{
		cpu:        cpuModel(),
		cores:      runtime.NumCPU(),
		gomaxprocs: runtime.GOMAXPROCS(0),
		os:         osName(),
		goVersion:  runtime.Version(),
		loadStart:  loadAverage(),
	}
}

// cpuModel is the first "model name" of /proc/cpuinfo, or the architecture
// where there is none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v) + " (" + runtime.GOARCH + ")"
		}
	}
	return runtime.GOARCH
}

// osName is the distribution's PRETTY_NAME and the kernel release, or GOOS.
func osName() string {
	name := runtime.GOOS
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
				name = strings.Trim(v, `"`)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		name += ", " + runtime.GOOS + " " + strings.TrimSpace(string(b))
	}
	return name
}

// loadAverage is the first three fields of /proc/loadavg, or "".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
