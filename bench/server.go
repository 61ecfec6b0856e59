package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// poolSize is the connection pool of every client the benchmark makes: more
// than the 64 goroutines of the concurrent publish scenario.
const poolSize = 128

// server is the Redis or Valkey server every side of every scenario runs
// against: a private, non-persistent process on a loopback port, or one
// given with -addr.
type server struct {
	addr     string
	private  bool // started by this program
	canFlush bool // FLUSHALL between scenarios is allowed
	name     string
	version  string

	cmd    *exec.Cmd     // nil for a server given with -addr
	exited chan struct{} // closed when cmd has exited
	dir    string
}

// startServer starts bin (redis-server or valkey-server) on a free loopback
// port, without persistence, and waits until it answers.
func startServer(ctx context.Context, bin string) (*server, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("finding the server binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "valkeystream-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating the server directory: %w", err)
	}
	var lastErr error
	for range 3 { // the free port may be taken before the server binds it
		s := &server{private: true, canFlush: true, dir: dir}
		if lastErr = s.launch(ctx, path); lastErr == nil {
			return s, nil
		}
		s.stop()
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("starting %s: %w", bin, lastErr)
}

func (s *server) launch(ctx context.Context, path string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.cmd = exec.Command(path,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "server.log"),
		"--daemonize", "no",
	)
	s.cmd.SysProcAttr = serverProcAttr()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", path, err)
	}
	s.exited = make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.readInfo(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("the server exited at start: %s", s.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not answer within 10s: %w; log: %s", err, s.logTail())
		}
	}
}

// connectServer uses a running server at addr.
func connectServer(ctx context.Context, addr string, canFlush bool) (*server, error) {
	s := &server{addr: addr, canFlush: canFlush}
	if err := s.readInfo(ctx); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return s, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// newClient returns a new client of the server. Each side of a scenario gets
// its own.
func (s *server) newClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: poolSize})
}

// readInfo reads the server's name and version from INFO server.
func (s *server) readInfo(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	s.name, s.version = parseServerInfo(info)
	return nil
}

// parseServerInfo returns the server's name and version from the text of
// INFO server. Valkey reports itself in server_name and valkey_version (and
// keeps a redis_version for compatibility).
func parseServerInfo(info string) (name, version string) {
	fields := map[string]string{}
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			fields[k] = v
		}
	}
	switch {
	case fields["valkey_version"] != "":
		return "Valkey", fields["valkey_version"]
	case fields["server_name"] != "":
		return fields["server_name"], fields["redis_version"]
	default:
		return "Redis", fields["redis_version"]
	}
}

// reset empties the server between scenarios when that is allowed. Every run
// deletes its own keys either way.
func (s *server) reset(ctx context.Context, c redis.UniversalClient) error {
	if !s.canFlush {
		return nil
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("FLUSHALL: %w", err)
	}
	return nil
}

// stop ends a private server and removes its directory; for a server given
// with -addr it does nothing.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// remove deletes the private server's directory once it has stopped.
func (s *server) remove() {
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func (s *server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	b = bytes.TrimSpace(b)
	if len(b) > 800 {
		b = b[len(b)-800:]
	}
	return string(b)
}

// describe is the server as the report names it.
func (s *server) describe() string {
	kind := "given with -addr"
	if s.private {
		kind = "private, non-persistent, on loopback"
	}
	return fmt.Sprintf("%s %s (%s)", s.name, s.version, kind)
}
