package sharedread

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
)

// readerConn is a reader's connection, with the calls that run on it
// counted (bounded.Conn), so that a call its reader stopped waiting for
// (bounded.Call) is never pulled from under it: a *redis.Conn (a
// connection taken from the user's client, see newReader) is closed only
// once no call runs on it; a client of the reader's own (*redis.Client,
// see newOwnConn) is closed at once, which ends a read on a cut network at
// once.
type readerConn struct {
	rc   readConn
	own  bool // rc is a client of the reader's own
	conn *bounded.Conn[readConn]
}

// errConnClosed fails a call that did not start because its connection had
// been closed.
var errConnClosed = errors.New("sharedread: the reader's connection is closed")

func newReaderConn(rc readConn) *readerConn {
	_, own := rc.(*redis.Client)
	return &readerConn{rc: rc, own: own, conn: bounded.NewConn(rc, own)}
}

// call runs f on the connection and waits for it as bounded.Call does:
// until it returns, or until ctx ends. A call that outlives ctx goes on,
// and closes the connection when it returns if Close was called
// meanwhile. f does not run, and call returns errConnClosed, once the
// connection is closing.
func (c *readerConn) call(ctx context.Context, f func(readConn)) error {
	var closed bool
	if err := bounded.Call(ctx, func() { closed = !c.conn.Use(f) }); err != nil {
		return err
	}
	if closed {
		return errConnClosed
	}
	return nil
}

// Close closes the connection: at once when no call runs on it (or it is
// a client of the reader's own), else when the last call returns. It
// returns at once either way. Calls after it do not run.
func (c *readerConn) Close() { c.conn.Close() }
