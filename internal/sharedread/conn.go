package sharedread

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
)

// readerConn is a reader's connection, with the calls that run on it
// counted, so that a call its reader stopped waiting for (bounded.Call)
// is never pulled from under it.
//
// A *redis.Conn (a connection taken from the user's client, see newReader)
// is closed only once no call runs on it: its Close closes the channel
// that a call in progress sends the connection back on when it returns (a
// data race, and a send on a closed channel that go-redis recovers). So a
// Close while a call runs is left to that call, which closes the
// connection when it returns, within the client's own timeouts. A client
// of the reader's own (*redis.Client, see newOwnConn) is closed at once:
// its pool is made to be closed while calls run, and closing it ends a
// read on a cut network at once.
type readerConn struct {
	rc  readConn
	own bool // rc is a client of the reader's own

	mu      sync.Mutex
	calls   int  // calls running on rc
	closing bool // Close was called
	closed  bool // rc was closed
}

// errConnClosed fails a call that did not start because its connection had
// been closed.
var errConnClosed = errors.New("sharedread: the reader's connection is closed")

func newReaderConn(rc readConn) *readerConn {
	_, own := rc.(*redis.Client)
	return &readerConn{rc: rc, own: own}
}

// call runs f on the connection and waits for it as bounded.Call does:
// until it returns, or until ctx ends. A call that outlives ctx goes on,
// and closes the connection when it returns if Close was called
// meanwhile. f does not run, and call returns errConnClosed, once the
// connection is closing.
func (c *readerConn) call(ctx context.Context, f func(readConn)) error {
	var closed bool
	if err := bounded.Call(ctx, func() { closed = !c.run(f) }); err != nil {
		return err
	}
	if closed {
		return errConnClosed
	}
	return nil
}

// run runs f, counted, unless the connection is closing, and reports
// whether it ran.
func (c *readerConn) run(f func(readConn)) bool {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return false
	}
	c.calls++
	c.mu.Unlock()
	defer c.end()
	f(c.rc)
	return true
}

// end counts a call out, and closes the connection when it was the last
// one and Close was called.
func (c *readerConn) end() {
	c.mu.Lock()
	c.calls--
	last := c.closing && c.calls == 0 && !c.closed
	c.closed = c.closed || last
	c.mu.Unlock()
	if last {
		_ = c.rc.Close() // fails only when closed already, which closed prevents
	}
}

// Close closes the connection: at once when no call runs on it (or it is
// a client of the reader's own), else when the last call returns. It
// returns at once either way. Calls after it do not run.
func (c *readerConn) Close() {
	c.mu.Lock()
	now := !c.closing && !c.closed && (c.calls == 0 || c.own)
	c.closing = true
	c.closed = c.closed || now
	c.mu.Unlock()
	if now {
		_ = c.rc.Close() // fails only when closed already, which closed prevents
	}
}
