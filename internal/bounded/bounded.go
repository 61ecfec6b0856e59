// Package bounded bounds the wait for a call to the server by its context,
// whatever the client's options. go-redis applies a context's deadline or
// cancellation to a call in progress only with ContextTimeoutEnabled; else
// a call on a cut connection lasts the client's ReadTimeout times its
// retries (12 s with the defaults). Call stops waiting when the context
// ends; the call itself goes on in its goroutine until the client's own
// timeouts end it, and what it returns then is dropped.
package bounded

import (
	"context"
	"errors"
	"time"
)

// Grace is how long Call still waits for a call in progress when its
// context is cancelled (rather than past its deadline): a server that is
// there answers in far less, and its answer is then known (an Ack's
// outcome, the entries a read took); a cut network is given up after it.
const Grace = 200 * time.Millisecond

// Call runs f and returns nil once it has returned, or ctx's error when
// ctx ends first: at once past its deadline, after Grace more when it was
// cancelled. With a context that never ends, f runs on the caller's
// goroutine. f must not touch what the caller reads once Call returned an
// error.
func Call(ctx context.Context, f func()) error {
	if ctx.Done() == nil {
		f()
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		select {
		case <-done: // it ended as well: its result stands
			return nil
		default:
			return ctx.Err()
		}
	}
	t := time.NewTimer(Grace)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return ctx.Err()
	}
}
