package testserver

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyDialTimeout bounds how long a Proxy waits to connect to its target.
const proxyDialTimeout = 2 * time.Second

// Proxy is a TCP proxy on a free 127.0.0.1 port that forwards each
// connection to a target server, both ways, and can play network faults
// between a client and that server: a silent partition (Cut, Heal),
// connections reset (Reset) and a storm of resets (ResetEvery). Its
// methods are safe for concurrent use.
type Proxy struct {
	t      testing.TB
	target string
	ln     *net.TCPListener
	gate   *gate
	links  linkSet
	stats  proxyCounters

	mu     sync.Mutex
	closed bool
	done   chan struct{}  // closed by Close
	wg     sync.WaitGroup // every goroutine the proxy started
}

// ProxyStats counts what went through a Proxy since NewProxy.
type ProxyStats struct {
	// Accepted is the number of client connections accepted.
	Accepted int64
	// Reset is the number of connections that Reset and ResetEvery ended.
	Reset int64
	// ToServer and ToClient are the bytes delivered to the target and to
	// the clients; bytes held by Cut count once they are delivered.
	ToServer, ToClient int64
}

type proxyCounters struct {
	accepted, reset, toServer, toClient atomic.Int64
}

// NewProxy starts a proxy to target (host:port) and registers its Close
// with t.Cleanup. Connections to the target are made as clients connect.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("testserver: proxy to %s: %v", target, err)
	}
	p := &Proxy{t: t, target: target, ln: ln, gate: newGate(), done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port, for the client to dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut holds, from now on, every byte in both directions of every
// connection, current and new, without closing anything: new connections
// are accepted but nothing flows, and a client's reads time out as on a
// silent network. Bytes are held, not dropped, so Heal delivers them, as
// TCP does when a partition heals. Bytes already on their way when Cut is
// called may still arrive.
func (p *Proxy) Cut() { p.gate.cut() }

// Heal delivers, in order, what Cut held and forwards again.
func (p *Proxy) Heal() { p.gate.heal() }

// Reset closes every current connection abruptly (SO_LINGER 0: the client
// and the server see a connection reset), and keeps accepting new ones.
// It returns how many connections it closed.
func (p *Proxy) Reset() int {
	n := p.links.reset(false)
	p.stats.reset.Add(int64(n))
	return n
}

// ResetEvery runs Reset every interval during span (a reset storm), in the
// background, and returns a channel closed once the storm is over: after
// span, or at Close. interval and span must be positive.
func (p *Proxy) ResetEvery(interval, span time.Duration) <-chan struct{} {
	over := make(chan struct{})
	if interval <= 0 || span <= 0 {
		p.t.Errorf("testserver: proxy ResetEvery(%v, %v): both must be positive", interval, span)
		close(over)
		return over
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		close(over)
		return over
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer close(over)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		end := time.NewTimer(span)
		defer end.Stop()
		for {
			select {
			case <-tick.C:
				p.Reset()
			case <-end.C:
				return
			case <-p.done:
				return
			}
		}
	}()
	return over
}

// Stats returns the counters.
func (p *Proxy) Stats() ProxyStats {
	return ProxyStats{
		Accepted: p.stats.accepted.Load(),
		Reset:    p.stats.reset.Load(),
		ToServer: p.stats.toServer.Load(),
		ToClient: p.stats.toClient.Load(),
	}
}

// Close stops accepting, resets every connection, ends a storm and waits
// for all the proxy's goroutines. NewProxy registers it with t.Cleanup;
// calling it again does nothing.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	_ = p.ln.Close()
	p.links.reset(true)
	p.wg.Wait()
}

// accept takes client connections until Close.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors or the like: try again shortly.
			select {
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		l := newLink(c)
		if !p.links.add(l) {
			_ = c.Close()
			return
		}
		p.stats.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(l)
	}
}

// serve connects l to the target and pumps both ways until the link ends.
// A target that cannot be reached resets the client's connection.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer p.links.remove(l)
	c, err := net.DialTimeout("tcp", p.target, proxyDialTimeout)
	if err != nil {
		l.end(true)
		return
	}
	server := c.(*net.TCPConn)
	if !l.attach(server) {
		return
	}
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() {
		defer pumps.Done()
		pump(l, p.gate, server, l.client, &p.stats.toServer)
	}()
	go func() {
		defer pumps.Done()
		pump(l, p.gate, l.client, server, &p.stats.toClient)
	}()
	pumps.Wait()
	l.end(false)
}
