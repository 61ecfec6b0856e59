package testserver

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
)

// Dialed records the connections a client dials (pass Dial as its
// options' Dialer), so that a test can wait for one to be closed without
// sending anything: a command sent would order, for the race detector,
// whatever happened before it ahead of every later read from a socket, and
// could hide the race the test is after.
type Dialed struct {
	mu    sync.Mutex
	conns []*WatchedConn
}

// WatchedConn is a connection dialed through Dialed.Dial.
type WatchedConn struct {
	net.Conn
	addr   string
	once   sync.Once
	closed chan struct{}
}

// Closed is closed by the connection's first Close.
func (c *WatchedConn) Closed() <-chan struct{} { return c.closed }

func (c *WatchedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// Dial dials addr and records the connection.
func (d *Dialed) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	w := &WatchedConn{Conn: c, addr: addr, closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, w)
	d.mu.Unlock()
	return w, nil
}

// Count returns how many connections to addr were dialed.
func (d *Dialed) Count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.conns {
		if c.addr == addr {
			n++
		}
	}
	return n
}

// Find returns the connection whose local address is addr (as the
// server's CLIENT LIST names its client: see ClientField), or fails t.
func (d *Dialed) Find(t testing.TB, addr string) *WatchedConn {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		if c.LocalAddr().String() == addr {
			return c
		}
	}
	t.Fatalf("no connection dialed from %s", addr)
	return nil
}

// ClientField returns the value of name in a line of CLIENT LIST.
func ClientField(line, name string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}
