package testserver_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// client returns a fresh client that does not retry, so a command fails
// if the server is not answering right now.
func client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		MaxRetries:      -1,
		DialTimeout:     time.Second,
		DialerRetries:   1,
		ReadTimeout:     5 * time.Second, // the server fsyncs every write
		DisableIdentity: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// serverPID returns process_id from INFO server.
func serverPID(t *testing.T, addr string) int {
	t.Helper()
	info, err := client(t, addr).Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatalf("info server: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("process_id %q: %v", v, err)
			}
			return pid
		}
	}
	t.Fatalf("no process_id in INFO server:\n%s", info)
	return 0
}

func requireValue(t *testing.T, addr, key, want string) {
	t.Helper()
	got, err := client(t, addr).Get(context.Background(), key).Result()
	if err != nil || got != want {
		t.Fatalf("GET %s = %q, %v; want %q", key, got, err, want)
	}
}

func noErr(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

func TestServer(t *testing.T) {
	s := testserver.Start(t)
	ctx := context.Background()
	if s.Addr() == "" || s.Name() == "" || s.Version() == "" {
		t.Fatalf("Addr %q, Name %q, Version %q: want all non-empty", s.Addr(), s.Name(), s.Version())
	}

	key := "testserver:" + t.Name() + ":" + strconv.FormatInt(time.Now().UnixNano(), 10)
	noErr(t, client(t, s.Addr()).Set(ctx, key, "v1", time.Hour).Err(), "SET")
	requireValue(t, s.Addr(), key, "v1")

	if !s.Restartable() {
		if cmd := s.RestartCommand(); cmd != nil {
			t.Errorf("RestartCommand() = %q, want nil for an external server", cmd)
		}
		if s.Kill() == nil {
			t.Errorf("Kill on an external server: want an error")
		}
		t.Skip("external server (VALKEYSTREAM_TEST_ADDR): restart not possible")
	}

	// Restart: the key survives through the append-only file.
	pid0 := serverPID(t, s.Addr())
	noErr(t, s.Restart(), "Restart")
	pid1 := serverPID(t, s.Addr())
	if pid1 == pid0 {
		t.Fatalf("pid %d unchanged after Restart", pid0)
	}
	requireValue(t, s.Addr(), key, "v1")

	// RestartCommand: returns only once a new process answers. Many times
	// in a row: the supervisor must not give up on a server that is killed
	// from outside again and again.
	cmdline := s.RestartCommand()
	if len(cmdline) == 0 {
		t.Fatal("RestartCommand() is empty for a restartable server")
	}
	prev := pid1
	for i := range 12 {
		out, err := exec.Command(cmdline[0], cmdline[1:]...).CombinedOutput()
		noErr(t, err, "restart command #%d (output %q)", i+1, out)
		pid := serverPID(t, s.Addr())
		if pid == prev {
			t.Fatalf("pid %d unchanged after restart command #%d", pid, i+1)
		}
		prev = pid
		requireValue(t, s.Addr(), key, "v1")
	}

	// Kill leaves it down: the supervisor must not bring it back.
	noErr(t, s.Kill(), "Kill")
	if client(t, s.Addr()).Ping(ctx).Err() == nil {
		t.Fatal("PING answered right after Kill")
	}
	time.Sleep(500 * time.Millisecond) // the time is the scenario: no restart within it
	if client(t, s.Addr()).Ping(ctx).Err() == nil {
		t.Fatal("PING answered 500ms after Kill: server restarted by itself")
	}

	noErr(t, s.StartAgain(), "StartAgain")
	noErr(t, client(t, s.Addr()).Ping(ctx).Err(), "PING after StartAgain")
	requireValue(t, s.Addr(), key, "v1")

	// StartAgain on a running server is a no-op.
	pid := serverPID(t, s.Addr())
	noErr(t, s.StartAgain(), "second StartAgain")
	if got := serverPID(t, s.Addr()); got != pid {
		t.Fatalf("StartAgain on a running server changed pid %d to %d", pid, got)
	}
}

func TestExternalAddr(t *testing.T) {
	inner := testserver.Start(t)
	t.Setenv("VALKEYSTREAM_TEST_ADDR", inner.Addr())

	s := testserver.Start(t)
	if s.Addr() != inner.Addr() || s.Name() != inner.Name() || s.Version() != inner.Version() {
		t.Fatalf("external server %s %s %s, want %s %s %s",
			s.Addr(), s.Name(), s.Version(), inner.Addr(), inner.Name(), inner.Version())
	}
	if s.Restartable() {
		t.Error("Restartable() = true for an external server")
	}
	if cmd := s.RestartCommand(); cmd != nil {
		t.Errorf("RestartCommand() = %q, want nil", cmd)
	}
	if s.Kill() == nil || s.StartAgain() == nil || s.Restart() == nil {
		t.Error("Kill/StartAgain/Restart on an external server: want errors")
	}
}
