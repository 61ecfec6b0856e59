package main

// This file finds a server to run the migration on. It has nothing to do
// with the migration itself; read main.go for that.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// startServer returns the address of the server to use and a function that
// stops what was started: the server at VALKEYSTREAM_ADDR when set, else a
// private valkey-server or redis-server from PATH on a free loopback port,
// without persistence, in a temporary directory.
func startServer(ctx context.Context) (addr string, stop func(), err error) {
	if addr := os.Getenv("VALKEYSTREAM_ADDR"); addr != "" {
		fmt.Printf("   VALKEYSTREAM_ADDR is set: using the server at %s (the example uses keys of its own)\n", addr)
		return addr, func() {}, waitPing(ctx, addr, nil)
	}
	var bin string
	for _, name := range []string{"valkey-server", "redis-server"} {
		if path, err := exec.LookPath(name); err == nil {
			bin = path
			break
		}
	}
	if bin == "" {
		return "", nil, fmt.Errorf("neither valkey-server nor redis-server is on PATH: install one (apt-get install redis-server) or set VALKEYSTREAM_ADDR=host:port")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "valkeystream-migrate-")
	if err != nil {
		return "", nil, err
	}
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var output bytes.Buffer
	cmd := exec.Command(bin, "--save", "", "--appendonly", "no",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir)
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	}
	if err := waitPing(ctx, addr, exited); err != nil {
		stop()
		return "", nil, fmt.Errorf("%s: %w; its output:\n%s", bin, err, output.String())
	}
	fmt.Printf("   started a private %s on %s\n", bin, addr)
	return addr, stop, nil
}

// waitPing polls addr with PING for up to 30s, or until exited is closed.
func waitPing(ctx context.Context, addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pingCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pingCtx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING on %s within 30s: %w", addr, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("the server exited before answering PING")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
