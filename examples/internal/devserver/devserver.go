// Package devserver finds a Redis-protocol server for the examples to run
// against: the one at VALKEYSTREAM_ADDR, a private valkey-server or
// redis-server, or an embedded miniredis. It has nothing to do with
// valkeystream itself.
package devserver

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Server is the Redis-protocol server an example runs against.
type Server struct {
	Addr  string // host:port
	About string // what it is, for the reader
	// Embedded is true for the in-process miniredis.
	Embedded bool
	// External is true for the server at VALKEYSTREAM_ADDR, which the
	// example did not start.
	External bool
	// Stop shuts down what Start started (a no-op for an external server).
	Stop func()
}

// AddrFlag defines the -addr flag: the host:port of the server to use, by
// default $VALKEYSTREAM_ADDR. Pass its value to UseAddr after flag.Parse.
func AddrFlag() *string {
	return flag.String("addr", os.Getenv("VALKEYSTREAM_ADDR"), "host:port of the server (default $VALKEYSTREAM_ADDR; empty: start a private one)")
}

// UseAddr makes Start use the server at addr, unless addr is empty, by
// setting VALKEYSTREAM_ADDR.
func UseAddr(addr string) error {
	if addr == "" {
		return nil
	}
	return os.Setenv("VALKEYSTREAM_ADDR", addr)
}

// Start picks the server, in this order:
//
//  1. VALKEYSTREAM_ADDR, when set: a server someone else runs.
//  2. valkey-server or redis-server from PATH: a private, throwaway instance
//     on a free port in a temporary directory, killed at the end.
//  3. An embedded, in-process miniredis, after checking that it implements
//     every stream command the library uses.
func Start(ctx context.Context) (*Server, error) {
	if addr := os.Getenv("VALKEYSTREAM_ADDR"); addr != "" {
		fmt.Printf("   VALKEYSTREAM_ADDR is set: using the server at %s\n", addr)
		about, err := serverVersion(ctx, addr)
		if err != nil {
			return nil, fmt.Errorf("server at VALKEYSTREAM_ADDR=%s: %w", addr, err)
		}
		return &Server{Addr: addr, About: about, External: true, Stop: func() {}}, nil
	}

	for _, name := range []string{"valkey-server", "redis-server"} {
		if bin, err := exec.LookPath(name); err == nil {
			return StartPrivate(ctx, bin)
		}
	}

	fmt.Println("   VALKEYSTREAM_ADDR is not set and neither valkey-server nor redis-server is on PATH:")
	fmt.Println("   starting an embedded in-process miniredis")
	return startMiniredis(ctx)
}

// StartPrivate runs bin (valkey-server or redis-server) on a free
// loopback port, without persistence, in a temporary directory.
func StartPrivate(ctx context.Context, bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "valkeystream-example-")
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	fmt.Printf("   found %s: starting a private instance on %s (data dir %s)\n", bin, addr, dir)

	var output bytes.Buffer // the server's log, shown only if it fails to start
	cmd := exec.Command(bin,
		"--save", "", "--appendonly", "no",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir)
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	}

	// Wait until it answers PING.
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pingCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := client.Ping(pingCtx).Err()
		cancel()
		if err == nil {
			break
		}
		select {
		case werr := <-exited:
			exited <- werr // let stop() find it
			stop()
			return nil, fmt.Errorf("%s exited before answering PING (%v); its output:\n%s", bin, werr, output.String())
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("%s did not answer PING on %s within 30s; its output:\n%s", bin, addr, output.String())
		}
	}

	about, err := serverVersion(ctx, addr)
	if err != nil {
		stop()
		return nil, err
	}
	return &Server{Addr: addr, About: about, Stop: stop}, nil
}

// Samples returns how many sample messages an example publishes at start:
// n, or when n is negative (its flag left at -1), own on a server it started
// itself and none on an external one, whose data may be someone else's.
func (s *Server) Samples(n, own int) int {
	switch {
	case n >= 0:
		return n
	case s.External:
		return 0
	default:
		return own
	}
}

// freePort asks the kernel for a free port by listening on port 0, then
// releases it for the server to take.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serverVersion reads the server's name and version from INFO server.
func serverVersion(ctx context.Context, addr string) (string, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	info, err := client.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("INFO server: %w", err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	// Valkey reports valkey_version (and a redis_version kept for
	// compatibility); Redis only redis_version.
	if v := fields["valkey_version"]; v != "" {
		return "Valkey " + v, nil
	}
	if v := fields["redis_version"]; v != "" {
		return "Redis " + v, nil
	}
	return "unknown server (INFO server names no version)", nil
}

// startMiniredis starts the embedded server and checks that it can run the
// examples.
func startMiniredis(ctx context.Context) (*Server, error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("starting miniredis: %w", err)
	}
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	if missing := checkStreamCommands(ctx, client); len(missing) > 0 {
		mr.Close()
		fmt.Println("   the embedded miniredis cannot run this example; these stream commands failed:")
		for _, m := range missing {
			fmt.Println("     -", m)
		}
		return nil, errors.New("the embedded server lacks stream commands valkeystream needs: " +
			"install a real server (apt-get install redis-server, or valkey-server) " +
			"or set VALKEYSTREAM_ADDR=host:port")
	}
	fmt.Println("   miniredis implements every stream command valkeystream uses")
	return &Server{
		Addr:     mr.Addr(),
		About:    "embedded miniredis " + moduleVersion("github.com/alicebob/miniredis/v2") + " (in-process, not a real server)",
		Embedded: true,
		Stop:     mr.Close,
	}, nil
}

// checkStreamCommands runs each stream command valkeystream sends, in the
// form it sends it, on a scratch stream, and returns a line for each that
// failed.
func checkStreamCommands(ctx context.Context, c *redis.Client) (failed []string) {
	const key, group = "valkeystream-example:probe", "probe"
	defer c.Del(ctx, key)
	check := func(what string, err error) bool {
		if err != nil && !errors.Is(err, redis.Nil) {
			failed = append(failed, fmt.Sprintf("%s: %v", what, err))
			return false
		}
		return true
	}

	check("XGROUP CREATE ... MKSTREAM", c.XGroupCreateMkStream(ctx, key, group, "0").Err())
	id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"f", "v"}}).Result()
	if !check("XADD", err) {
		return failed
	}
	check("XREADGROUP ... COUNT BLOCK ... >", c.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "a", Streams: []string{key, ">"}, Count: 10, Block: 10 * time.Millisecond}).Err())
	check("XREADGROUP ... 0 (own pending entries)", c.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "a", Streams: []string{key, "0"}, Count: 10, Block: -1}).Err())
	check("XPENDING key group start end count consumer", c.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: key, Group: group, Start: id, End: id, Count: 1, Consumer: "a"}).Err())
	check("XCLAIM", c.XClaim(ctx, &redis.XClaimArgs{
		Stream: key, Group: group, Consumer: "b", MinIdle: 0, Messages: []string{id}}).Err())
	check("XAUTOCLAIM", c.Do(ctx, "XAUTOCLAIM", key, group, "a", 0, "0-0", "COUNT", 10).Err())
	check("XACK", c.XAck(ctx, key, group, id).Err())
	return failed
}

// moduleVersion returns the version of a module compiled into this program.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "(version unknown)"
}
