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
