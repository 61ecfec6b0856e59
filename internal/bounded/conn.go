package bounded

import (
	"io"
	"sync"
)

// Conn is a connection that calls may outlive their bound on (see Call),
// with the calls running on it counted, so that it is never closed from
// under one. A go-redis *redis.Conn, a connection taken from a client's
// pool, needs it: its Close closes the channel that a call in progress
// sends the connection back on when it returns (a data race, and a send on
// a closed channel that go-redis recovers). So a Close while a call runs
// is left to that call, which closes the connection when it returns,
// within the client's own timeouts. A connection that can be closed while
// calls run (a client of one's own, whose Close ends a call on a cut
// network at once) is closed at once: closeAtOnce.
type Conn[C io.Closer] struct {
	c           C
	closeAtOnce bool

	mu      sync.Mutex
	calls   int  // calls running on c
	closing bool // Close was called
	closed  bool // c was closed
}

// NewConn returns c, counted.
func NewConn[C io.Closer](c C, closeAtOnce bool) *Conn[C] {
	return &Conn[C]{c: c, closeAtOnce: closeAtOnce}
}

// Use runs f on the connection, counted, unless it is closing, and reports
// whether f ran.
func (c *Conn[C]) Use(f func(C)) bool {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return false
	}
	c.calls++
	c.mu.Unlock()
	defer c.end()
	f(c.c)
	return true
}

// end counts a call out, and closes the connection when it was the last
// one and Close was called.
func (c *Conn[C]) end() {
	c.mu.Lock()
	c.calls--
	last := c.closing && c.calls == 0 && !c.closed
	c.closed = c.closed || last
	c.mu.Unlock()
	if last {
		_ = c.c.Close() // fails only when closed already, which closed prevents
	}
}

// Close closes the connection: at once when no call runs on it (or it was
// made closeAtOnce), else when the last call returns. It returns at once
// either way. Calls after it do not run.
func (c *Conn[C]) Close() {
	c.mu.Lock()
	now := !c.closing && !c.closed && (c.calls == 0 || c.closeAtOnce)
	c.closing = true
	c.closed = c.closed || now
	c.mu.Unlock()
	if now {
		_ = c.c.Close() // fails only when closed already, which closed prevents
	}
}
