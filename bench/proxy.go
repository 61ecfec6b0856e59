package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A delayProxy puts network distance between the benchmark's clients and the
// server without root or tc: it forwards loopback TCP connections to the
// server and holds what the server sends back for a fixed delay.
//
// The delay is added to one direction only, the server's replies. Timers
// here fire about a millisecond late at the earliest, so a delay split over
// both directions would pay that lateness twice. Each chunk read from the
// server is stamped with its arrival and released at arrival+delay by a
// writer of its own, while the reader goes on reading: chunks in flight
// overlap, as they do on a real link, and throughput is not cut to one chunk
// per delay. What the proxy really adds is measured (see measureRTT) and
// reported next to every figure.
type delayProxy struct {
	target string
	delay  time.Duration
	ln     net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// proxyChunk is the most the proxy reads from the server at once.
const proxyChunk = 64 << 10

// proxyQueue is how many chunks may wait in one connection's delay queue
// (at most proxyQueue*proxyChunk bytes); a full queue stops reading from
// the server until the oldest chunk is released.
const proxyQueue = 1024

// startDelayProxy listens on a free loopback port and forwards every
// connection to target, delaying the replies by delay.
func startDelayProxy(target string, delay time.Duration) (*delayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the delay proxy: %w", err)
	}
	p := &delayProxy{target: target, delay: delay, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// addr is where clients connect to reach the server through the proxy.
func (p *delayProxy) addr() string { return p.ln.Addr().String() }

func (p *delayProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Go(func() { p.forward(client, server) })
	}
}

// track registers a pair of connections for Close; false when the proxy is
// closing (and the pair was closed).
func (p *delayProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *delayProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

// forward copies client to server as it comes, and server to client through
// the delay queue, until either side closes.
func (p *delayProxy) forward(client, server net.Conn) {
	defer p.untrack(client, server)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(server, client)
		// The client is gone: closing the server side ends the other half.
		server.Close()
	})
	wg.Go(func() {
		copyDelayed(client, server, p.delay)
		client.Close()
	})
	wg.Wait()
}

// A stamped chunk waits in the delay queue until its release time.
type stampedChunk struct {
	release time.Time
	data    []byte
}

// copyDelayed copies src to dst, each chunk no earlier than delay after it
// was read, and returns when src ends or dst fails, having closed src if it
// is an io.Closer. Chunks keep their order: they arrive in order and all
// wait the same delay.
func copyDelayed(dst io.Writer, src io.Reader, delay time.Duration) {
	queue := make(chan stampedChunk, proxyQueue)
	stop := make(chan struct{}) // closed when the writer fails
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(queue)
		buf := make([]byte, proxyChunk)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case queue <- stampedChunk{time.Now().Add(delay), bytes.Clone(buf[:n])}:
				case <-stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	writeDelayed(dst, queue, stop)
	if c, ok := src.(io.Closer); ok {
		// dst failed or src ended: either way the reader has nothing left
		// to do, and a read in progress must not wait for more.
		_ = c.Close()
	}
	wg.Wait()
}

// writeDelayed writes each chunk of queue at its release time. After a
// wait it writes every chunk that has come due meanwhile in one call.
func writeDelayed(dst io.Writer, queue <-chan stampedChunk, stop chan<- struct{}) {
	defer close(stop)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var out []byte
	var held *stampedChunk // taken from the queue but not due yet
	for {
		c := held
		if c == nil {
			next, ok := <-queue
			if !ok {
				return
			}
			c = &next
		}
		held = nil
		if wait := time.Until(c.release); wait > 0 {
			timer.Reset(wait)
			<-timer.C
		}
		out = append(out[:0], c.data...)
		ended := false
	gather:
		for {
			select {
			case next, ok := <-queue:
				if !ok {
					ended = true
					break gather
				}
				if next.release.After(time.Now()) {
					held = &next
					break gather
				}
				out = append(out, next.data...)
			default:
				break gather
			}
		}
		if _, err := dst.Write(out); err != nil || ended {
			return
		}
		if cap(out) > 4*proxyChunk {
			out = nil // do not keep a large burst's buffer
		}
	}
}

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *delayProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// rttPings is how many PINGs measureRTT times.
const rttPings = 101

// measureRTT returns the median time of a PING round trip to addr, over
// rttPings sequential PINGs on one connection (after one to open it).
func measureRTT(ctx context.Context, addr string) (time.Duration, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return 0, fmt.Errorf("PING through %s: %w", addr, err)
	}
	times := make([]time.Duration, rttPings)
	for i := range times {
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			return 0, fmt.Errorf("PING through %s: %w", addr, err)
		}
		times[i] = time.Since(start)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}
