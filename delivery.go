package valkeystream

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

const (
	// backoffMin and backoffMax bound the wait after a failed call to the
	// server; it doubles with each consecutive failure.
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second

	// closeFlushTimeout bounds how long Close waits for the last Acks to
	// reach the server.
	closeFlushTimeout = 5 * time.Second
)

// deliver sends msg on out and waits until it is Acked or Nacked. flush, when
// not nil, fires while the loop waits; onFlush is then called. It returns
// ok=false when ctx ended first; acked is then still true if the Ack came
// before the end, so that Close sends it.
func deliver(ctx context.Context, out chan<- *message.Message, msg *message.Message,
	flush func() <-chan time.Time, onFlush func(context.Context)) (acked, ok bool) {
	for sent := false; !sent; {
		select {
		case out <- msg:
			sent = true
		case <-flush():
			onFlush(ctx)
		case <-ctx.Done():
			return false, false
		}
	}
	for {
		select {
		case <-msg.Acked():
			return true, true
		case <-msg.Nacked():
			return false, true
		case <-flush():
			onFlush(ctx)
		case <-ctx.Done():
			select {
			case <-msg.Acked():
				return true, false
			default:
				return false, false
			}
		}
	}
}

// noFlush is the flush of a loop that has nothing to flush.
func noFlush() <-chan time.Time { return nil }

func noFlushNeeded(context.Context) {}

// backoff returns the wait before retry number attempt (1 for the first),
// with a little jitter so that many consumers do not retry in step.
func backoff(attempt int) time.Duration {
	d := backoffMin
	for i := 1; i < attempt && d < backoffMax; i++ {
		d *= 2
	}
	d = min(d, backoffMax)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// sleep waits for d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
