// Package e2e holds what the examples' end-to-end tests share: building an
// example's binary, a private server, polling waits and the state of the
// server's streams. The child processes the tests run are in process.go.
package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/examples/internal/devserver"
)

// Build runs go build to write the package pkg to the binary out, with the
// race detector when race is set (pass RaceEnabled to build it as the test
// itself is built).
func Build(ctx context.Context, t testing.TB, out, pkg string, race bool) {
	t.Helper()
	args := []string{"build", "-o", out, pkg}
	if race {
		args = []string{"build", "-race", "-o", out, pkg}
	}
	if output, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, output)
	}
}

// StartServer starts a private server, stopped when the test ends:
// VALKEYSTREAM_TEST_SERVER (a binary name or path), else redis-server or
// valkey-server from PATH.
func StartServer(ctx context.Context, t testing.TB) *devserver.Server {
	t.Helper()
	names := []string{"redis-server", "valkey-server"}
	if name := os.Getenv("VALKEYSTREAM_TEST_SERVER"); name != "" {
		names = []string{name}
	}
	for _, name := range names {
		bin, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		srv, err := devserver.StartPrivate(ctx, bin)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		return srv
	}
	t.Fatalf("no server binary among %v: install one (apt-get install -y redis-server) or set VALKEYSTREAM_TEST_SERVER", names)
	return nil
}

// WaitFor polls cond every interval until it holds, failing the test with
// cond's last description after timeout or when ctx ends.
func WaitFor(ctx context.Context, t testing.TB, what string, timeout, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: gave up after %s: %s", what, timeout, state)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v: %s", what, ctx.Err(), state)
		case <-time.After(interval):
		}
	}
}

// PendingEntries sums the pending entries of every group of the streams.
func PendingEntries(ctx context.Context, t testing.TB, c *redis.Client, streams ...string) int64 {
	t.Helper()
	var n int64
	for _, s := range streams {
		groups, err := c.XInfoGroups(ctx, s).Result()
		if err != nil {
			t.Fatalf("XINFO GROUPS %s: %v", s, err)
		}
		for _, g := range groups {
			n += g.Pending
		}
	}
	return n
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
