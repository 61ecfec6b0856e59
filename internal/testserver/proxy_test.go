package testserver_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// proxyClient returns a client of addr with one connection, the given read
// and write timeout and no retries, so each command shows what the network
// does.
func proxyClient(t *testing.T, addr string, readTimeout time.Duration) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        2,
		DialTimeout:     time.Second,
		DialerRetries:   1,
		ReadTimeout:     readTimeout,
		WriteTimeout:    readTimeout,
		MaxRetries:      -1,
		PoolSize:        1,
		DisableIdentity: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requireTimeout fails unless err is a network timeout.
func requireTimeout(t *testing.T, err error, what string) {
	t.Helper()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%s: got %v, want a timeout", what, err)
	}
}

// eventually calls f every 10 ms until it returns nil, failing after 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond) // the poll interval
	}
}

func TestProxyForwards(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	if p.Addr() == s.Addr() || !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Fatalf("proxy Addr %q, want a 127.0.0.1 port of its own (server %s)", p.Addr(), s.Addr())
	}
	noErr(t, proxyClient(t, p.Addr(), time.Second).Ping(context.Background()).Err(), "PING through the proxy")
	// The proxy counts the bytes it forwarded once its write returned,
	// which the client's read of them can come before.
	eventually(t, "the PING and the PONG counted", func() error {
		if st := p.Stats(); st.ToServer < int64(len("*1\r\n$4\r\nPING\r\n")) || st.ToClient < int64(len("+PONG\r\n")) {
			return fmt.Errorf("Stats() = %+v, want a PING to the server and a PONG back", st)
		}
		return nil
	})
	if st := p.Stats(); st.Accepted != 1 || st.Reset != 0 {
		t.Fatalf("Stats() = %+v, want 1 accepted, no reset", st)
	}
}

func TestProxyCutHeal(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	ctx := context.Background()
	c := proxyClient(t, p.Addr(), 200*time.Millisecond)
	noErr(t, c.Ping(ctx).Err(), "PING before the cut")

	p.Cut()
	requireTimeout(t, c.Ping(ctx).Err(), "PING on a connection made before the cut")
	fresh := proxyClient(t, p.Addr(), 200*time.Millisecond)
	requireTimeout(t, fresh.Ping(ctx).Err(), "PING on a connection made during the cut")
	if got := p.Stats().Accepted; got < 2 {
		t.Fatalf("Stats().Accepted = %d during the cut, want at least 2 (new connections are accepted)", got)
	}

	p.Heal()
	noErr(t, c.Ping(ctx).Err(), "PING after the heal")
	noErr(t, fresh.Ping(ctx).Err(), "PING on the second client after the heal")
}

// TestProxyCutHoldsBytes writes on a raw connection during a cut: nothing
// comes back until the heal, then the replies come in order.
func TestProxyCutHoldsBytes(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	conn, err := net.Dial("tcp", p.Addr())
	noErr(t, err, "dial the proxy")
	t.Cleanup(func() { _ = conn.Close() })
	r := bufio.NewReader(conn)

	p.Cut()
	_, err = conn.Write([]byte("ECHO one\r\nECHO two\r\n"))
	noErr(t, err, "write during the cut")
	noErr(t, conn.SetReadDeadline(time.Now().Add(200*time.Millisecond)), "set read deadline")
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read %q during the cut, want nothing", line)
	}
	if got := p.Stats().ToServer; got != 0 {
		t.Fatalf("Stats().ToServer = %d during the cut, want 0", got)
	}

	p.Heal()
	noErr(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)), "set read deadline")
	var got []string
	for range 4 {
		line, err := r.ReadString('\n')
		noErr(t, err, "read after the heal (so far %q)", got)
		got = append(got, strings.TrimRight(line, "\r\n"))
	}
	if want := "$3 one $3 two"; strings.Join(got, " ") != want {
		t.Fatalf("replies after the heal %q, want %q", strings.Join(got, " "), want)
	}
}

// TestProxyCutDeliversWrite sends a SET during a cut: the client times
// out, the server has nothing, and after the heal the held SET lands.
func TestProxyCutDeliversWrite(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	ctx := context.Background()
	c := proxyClient(t, p.Addr(), 200*time.Millisecond)
	direct := client(t, s.Addr())
	noErr(t, c.Ping(ctx).Err(), "PING before the cut")

	p.Cut()
	requireTimeout(t, c.Set(ctx, "held", "v", 0).Err(), "SET during the cut")
	if err := direct.Get(ctx, "held").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET held on the server during the cut: %v, want redis.Nil", err)
	}

	p.Heal()
	eventually(t, "the held SET after the heal", func() error {
		v, err := direct.Get(ctx, "held").Result()
		if err == nil && v != "v" {
			err = errors.New("value " + v)
		}
		return err
	})
}

// TestProxyReset resets a connection blocked in BLPOP: the command fails
// with a connection reset, and the client's next command reconnects.
func TestProxyReset(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	ctx := context.Background()
	c := proxyClient(t, p.Addr(), time.Second)
	direct := client(t, s.Addr())

	blpop := make(chan error, 1)
	go func() { blpop <- c.BLPop(ctx, 30*time.Second, "empty").Err() }()
	eventually(t, "BLPOP blocked on the server", func() error {
		info, err := direct.Info(ctx, "clients").Result()
		if err == nil && !strings.Contains(info, "blocked_clients:1\r\n") {
			err = errors.New("no blocked client yet")
		}
		return err
	})
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset() = %d, want 1 connection", n)
	}
	if err := <-blpop; !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("BLPOP across the reset: %v, want a connection reset", err)
	}
	noErr(t, c.Ping(ctx).Err(), "PING after the reset")
	if st := p.Stats(); st.Accepted != 2 || st.Reset != 1 {
		t.Fatalf("Stats() = %+v, want 2 accepted (a reconnection), 1 reset", st)
	}
}

// TestProxyResetEvery runs a storm over a client that keeps sending PING:
// some fail, the storm stops by itself, and the client then works.
func TestProxyResetEvery(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	ctx := context.Background()
	c := proxyClient(t, p.Addr(), time.Second)
	noErr(t, c.Ping(ctx).Err(), "PING before the storm")

	over := p.ResetEvery(20*time.Millisecond, 300*time.Millisecond)
	failed := 0
	for storm := true; storm; {
		select {
		case <-over:
			storm = false
		default:
			if c.Ping(ctx).Err() != nil {
				failed++
			}
		}
	}
	st := p.Stats()
	t.Logf("storm: %d resets, %d failed PINGs", st.Reset, failed)
	if st.Reset == 0 || failed == 0 {
		t.Fatalf("storm over with %d resets and %d failed PINGs, want some of each", st.Reset, failed)
	}
	for i := range 5 {
		noErr(t, c.Ping(ctx).Err(), "PING #%d after the storm", i+1)
	}
	if got := p.Stats().Reset; got != st.Reset {
		t.Fatalf("Stats().Reset went from %d to %d after the storm was over", st.Reset, got)
	}
}

// TestProxyClose closes a proxy with a held connection and a storm
// running: Close returns, the connection ends and no new one is accepted.
func TestProxyClose(t *testing.T) {
	testserver.Parallel(t)
	s := testserver.Start(t)
	p := testserver.NewProxy(t, s.Addr())
	conn, err := net.Dial("tcp", p.Addr())
	noErr(t, err, "dial the proxy")
	t.Cleanup(func() { _ = conn.Close() })
	p.Cut()
	_, err = conn.Write([]byte("PING\r\n"))
	noErr(t, err, "write during the cut")
	over := p.ResetEvery(time.Hour, time.Hour)

	p.Close()
	<-over
	noErr(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)), "set read deadline")
	if n, err := conn.Read(make([]byte, 16)); err == nil || isTimeout(err) {
		t.Fatalf("read after Close: %d bytes, %v; want the connection ended", n, err)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Fatal("dial after Close succeeded, want refused")
	}
	p.Close() // again: no-op
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
