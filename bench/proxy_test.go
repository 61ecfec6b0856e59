package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// startEcho starts a TCP server on loopback that sends back what it reads.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	return ln.Addr().String()
}

// dialProxy starts a delay proxy in front of an echo server and connects
// to it.
func dialProxy(t *testing.T, delay time.Duration) net.Conn {
	t.Helper()
	p, err := startDelayProxy(startEcho(t), delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("closing the proxy: %v", err)
		}
	})
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestDelayProxyPassesBytesIntact(t *testing.T) {
	c := dialProxy(t, 2*time.Millisecond)
	want := make([]byte, 3<<20+12345) // many proxy chunks, the last one short
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() {
		for rest := want; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(100_000)) // uneven writes
			if _, writeErr = c.Write(rest[:n]); writeErr != nil {
				return
			}
			rest = rest[n:]
		}
	})
	got := make([]byte, len(want))
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading back through the proxy: %v", err)
	}
	wg.Wait()
	if writeErr != nil {
		t.Fatalf("writing through the proxy: %v", writeErr)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("the bytes that came back differ from those sent, first at offset %d of %d", i, len(want))
	}
}

func TestDelayProxyDelaysByAboutTheDelay(t *testing.T) {
	const delay = 20 * time.Millisecond
	c := dialProxy(t, delay)
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 5)
	times := make([]time.Duration, 9)
	for i := range times {
		start := time.Now()
		if _, err := c.Write([]byte("ping!")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		times[i] = time.Since(start)
		if string(buf) != "ping!" {
			t.Fatalf("got %q back, want %q", buf, "ping!")
		}
	}
	med := summarize(times).p50 // sorts times: times[0] is the fastest
	// Never less than the delay; the upper bound only rules out a delay
	// paid many times over (the machine may be busy).
	if times[0] < delay || med > 10*delay {
		t.Errorf("round trips through a %s proxy took %v (median %s), want at least %s and a median near it", delay, times, med, delay)
	}
}

func TestDelayProxyOverlapsChunksInFlight(t *testing.T) {
	// Twenty messages, 5 ms apart, through a 100 ms delay: each comes back
	// no sooner than 100 ms after it was sent, and all of them within far
	// less than the 2 s that one delay per message in turn would take.
	const delay, n, gap = 100 * time.Millisecond, 20, 5 * time.Millisecond
	c := dialProxy(t, delay)
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	sent := make([]time.Time, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			sent[i] = time.Now()
			if _, err := c.Write([]byte{byte(i)}); err != nil {
				return
			}
			time.Sleep(gap) // the time is the scenario: the gap between writes
		}
	})
	start := time.Now()
	buf := make([]byte, 1)
	for i := range n {
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatalf("reading message %d: %v", i, err)
		}
		arrived := time.Now()
		if buf[0] != byte(i) {
			t.Fatalf("message %d came back as %d: out of order", i, buf[0])
		}
		wg.Wait() // sent[i] is written before the read can complete; wait once for the writer
		if took := arrived.Sub(sent[i]); took < delay {
			t.Errorf("message %d came back after %s, want at least %s", i, took, delay)
		}
	}
	if total := time.Since(start); total >= n*delay {
		t.Errorf("%d messages took %s through a %s proxy: the delays were paid one after another", n, total, delay)
	}
}

func TestDelayProxyCloseEndsConnections(t *testing.T) {
	p, err := startDelayProxy(startEcho(t), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("read %d bytes from a closed proxy, want an error", n)
	}
}

func TestMeasureRTTThroughProxyOfARealServer(t *testing.T) {
	ctx := t.Context()
	srv, err := startServer(ctx, "redis-server")
	if err != nil {
		t.Fatalf("starting redis-server (it must be on PATH): %v", err)
	}
	t.Cleanup(func() {
		srv.stop()
		srv.remove()
	})
	const delay = 10 * time.Millisecond
	p, err := startDelayProxy(srv.addr, delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	direct, err := measureRTT(ctx, srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	through, err := measureRTT(ctx, p.addr())
	if err != nil {
		t.Fatal(err)
	}
	if through < delay || through < direct {
		t.Errorf("round trip through a %s proxy: %s (direct: %s); want at least the delay", delay, through, direct)
	}
}
