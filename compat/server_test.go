package compat

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverAddr is the address of the server every test of the package uses,
// set by TestMain: VALKEYSTREAM_TEST_ADDR when set, else a private server
// started from VALKEYSTREAM_TEST_SERVER (a binary name or path) or the first
// of redis-server and valkey-server on PATH. Tests use keys of their own.
var serverAddr string

func TestMain(m *testing.M) {
	addr, stop, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "compat: no server to test against:", err)
		os.Exit(1)
	}
	serverAddr = addr
	code := m.Run()
	stop()
	os.Exit(code)
}

func startServer() (addr string, stop func(), err error) {
	if addr := os.Getenv("VALKEYSTREAM_TEST_ADDR"); addr != "" {
		return addr, func() {}, waitPing(addr, nil)
	}
	bin := os.Getenv("VALKEYSTREAM_TEST_SERVER")
	if bin == "" {
		for _, name := range []string{"redis-server", "valkey-server"} {
			if _, err := exec.LookPath(name); err == nil {
				bin = name
				break
			}
		}
	}
	if bin == "" {
		return "", nil, fmt.Errorf("neither redis-server nor valkey-server is on PATH: install one (apt-get install -y redis-server) or set VALKEYSTREAM_TEST_ADDR=host:port")
	}
	dir, err := os.MkdirTemp("", "valkeystream-compat-")
	if err != nil {
		return "", nil, err
	}
	var lastErr error
	for range 3 { // the free port may be taken before the server binds it
		addr, kill, err := launch(bin, dir)
		if err == nil {
			fmt.Fprintf(os.Stderr, "compat: testing against %s on %s\n", bin, addr)
			return addr, func() { kill(); _ = os.RemoveAll(dir) }, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return "", nil, fmt.Errorf("starting %s: %w", bin, lastErr)
}

// launch starts bin on a free loopback port, without persistence, and waits
// until it answers.
func launch(bin, dir string) (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var out bytes.Buffer
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
		"--logfile", filepath.Join(dir, "server.log"))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	if err := waitPing(addr, exited); err != nil {
		stop()
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return "", nil, fmt.Errorf("%w; log: %s %s", err, out.String(), log)
	}
	return addr, stop, nil
}

// waitPing polls addr with PING for up to 10s, or until exited is closed.
func waitPing(addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING on %s within 10s: %w", addr, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("the server exited before answering PING on %s", addr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// newClient returns a client of the server, closed when the test ends (a
// watermill-redisstream Publisher or Subscriber closes it earlier, on its
// Close).
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: serverAddr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
