package testserver

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// procConfig is what distinguishes a server process from the plain one:
// extra arguments (cluster mode, replicaof), or a sentinel configuration.
type procConfig struct {
	extra []string
	// sentinel, when set, is the content of sentinel.conf: the process runs
	// as a Sentinel, without persistence of its own.
	sentinel string
}

// procSpec is how every run of one private server process is started: the
// binary, its directory, its port and its mode. The port is fixed once
// startProcess returns.
type procSpec struct {
	bin  string
	dir  string
	port int
	mode procConfig
}

func (p procSpec) addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

func (p procSpec) args() []string {
	common := []string{
		"--port", strconv.Itoa(p.port),
		"--bind", "127.0.0.1",
		"--dir", p.dir,
		"--protected-mode", "no",
		"--daemonize", "no",
		"--logfile", p.logFile(),
	}
	if p.mode.sentinel != "" {
		return append([]string{p.sentinelConf(), "--sentinel"}, common...)
	}
	args := append(common,
		"--appendonly", "yes",
		"--appendfsync", "always",
		"--save", "",
	)
	return append(args, p.mode.extra...)
}

func (p procSpec) sentinelConf() string { return filepath.Join(p.dir, "sentinel.conf") }

func (p procSpec) pidFile() string { return filepath.Join(p.dir, "server.pid") }

func (p procSpec) logFile() string { return filepath.Join(p.dir, "server.log") }

// logTail returns the last lines of the server log, for error messages.
func (p procSpec) logTail() string {
	data, err := os.ReadFile(p.logFile())
	if err != nil || len(data) == 0 {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return "; server.log ends with:\n" + string(bytes.Join(lines, []byte("\n")))
}

// logSize returns the size of the server's log, 0 when there is none yet.
func (p procSpec) logSize() int64 {
	fi, err := os.Stat(p.logFile())
	if err != nil {
		return 0
	}
	return fi.Size()
}

// crashReport returns the part of the server's log written since offset
// from that says why it died: from the start of its bug report (a failed
// assertion or a signal; Redis and Valkey both print "=== ... BUG REPORT
// START") through the lines that name the failed check and the stack, or ""
// when the log has none.
func (p procSpec) crashReport(from int64) string {
	data, err := os.ReadFile(p.logFile())
	if err != nil || int64(len(data)) < from {
		return ""
	}
	lines := bytes.Split(data[from:], []byte("\n"))
	for i, line := range lines {
		if bytes.Contains(line, []byte("BUG REPORT START")) {
			end := min(i+40, len(lines))
			return "; server.log:\n" + string(bytes.Join(lines[max(i-3, 0):end], []byte("\n")))
		}
	}
	return ""
}
