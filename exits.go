package valkeystream

import (
	"sync"
	"time"

	"github.com/echomq/valkeystream/internal/loop"
)

// exits orders the ends of the group subscriptions that one Close ends
// together: each one's last round trip (its Acks not sent yet, its entries
// handed back) goes before any of them releases its consumer name. With
// many subscriptions on a small pool, their name releases would otherwise
// wait for connections beside those last round trips, which have a bound of
// their own (loop.ExitTimeout), and an Ack made just before Close would be
// delivered again for want of a connection.
//
// Its zero value is ready. A subscription counts from its start until its
// loop has left (Release is called right after); a Close's releases wait
// until none is counted, at most loop.ExitTimeout (the bound of those
// round trips, so Close ends within it as before).
type exits struct {
	mu      sync.Mutex
	leaving int           // subscriptions whose loop has not left yet
	none    chan struct{} // closed when leaving drops to 0; nil while it is 0
}

// add counts one subscription and returns what it calls once its loop has
// left (any later call does nothing).
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

// wait returns once no subscription counted has still to leave, or after
// loop.ExitTimeout.
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
