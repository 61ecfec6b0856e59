package valkeystream

import (
	"context"
	"sync"
	"time"

	"github.com/echomq/valkeystream/internal/loop"
)

// exits orders the ends of subscriptions that end together (a Close, or
// the cancel of the context a router gave every Subscribe): each one's last
// round trip (its Acks not sent yet, its entries handed back) goes before
// any of them releases its consumer name. With many subscriptions on a
// small pool, their name releases would otherwise wait for connections
// beside those last round trips, which have a bound of their own
// (loop.ExitTimeout), and an Ack made just before the end would be
// delivered again for want of a connection.
//
// Its zero value is ready. A subscription counts from the end of its
// context until its last round trip is done; its name release waits until
// none is counted, at most loop.ExitTimeout (the bound of those round
// trips, so a Close ends within its bound as before).
type exits struct {
	mu      sync.Mutex
	leaving int           // subscriptions ended whose last round trip is not done
	none    chan struct{} // closed when leaving drops to 0; nil while it is 0
}

// around returns release wrapped for a subscription whose context is ctx,
// to be called once its last round trip is done: from the end of ctx until
// then the subscription counts as leaving, and the call releases only once
// the others ended meanwhile are done too. A subscription whose call comes
// before its context's end is noticed neither waits nor is waited for.
func (x *exits) around(ctx context.Context, release func()) func() {
	var mu sync.Mutex
	var left func()
	done := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			left = x.add()
		}
	})
	return func() {
		stop()
		mu.Lock()
		done = true
		l := left
		mu.Unlock()
		if l != nil {
			l()
			x.wait()
		}
		release()
	}
}

// add counts one subscription and returns what it calls once its last
// round trip is done.
func (x *exits) add() (left func()) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.leaving == 0 {
		x.none = make(chan struct{})
	}
	x.leaving++
	return sync.OnceFunc(func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.leaving--
		if x.leaving == 0 {
			close(x.none)
			x.none = nil
		}
	})
}

// wait returns once no subscription counted has still to finish its last
// round trip, or after loop.ExitTimeout.
func (x *exits) wait() {
	x.mu.Lock()
	none := x.none
	x.mu.Unlock()
	if none == nil {
		return
	}
	t := time.NewTimer(loop.ExitTimeout)
	defer t.Stop()
	select {
	case <-none:
	case <-t.C:
	}
}
