package valkeystream

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
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

// chores are what a loop keeps doing while it waits for a handler: sending
// Acks that are due and renewing its hold on the entries it holds. Each due
// method returns nil when nothing is due. handedOver is called once the
// handler has taken a message.
type chores interface {
	handedOver()
	flushDue() <-chan time.Time
	flushWhileBusy(ctx context.Context)
	leaseDue() <-chan time.Time
	renewLeases(ctx context.Context)
}

// outcome is how a delivery ended.
type outcome int

const (
	stopped          outcome = iota // ctx ended first; the message was not Acked
	acked                           // the handler Acked it
	nacked                          // the handler Nacked it
	ackedThenStopped                // it was Acked, and ctx has ended
)

// deliver sends msg on out, counts it in sent, and waits until it is Acked or
// Nacked, doing c's chores (if any) meanwhile.
func deliver(ctx context.Context, out chan<- *message.Message, msg *message.Message, c chores, sent *atomic.Int64) outcome {
	for {
		flush, lease := dueOf(c)
		select {
		case out <- msg:
			sent.Add(1)
			if c != nil {
				c.handedOver()
			}
			return await(ctx, msg, c)
		case <-flush:
			c.flushWhileBusy(ctx)
		case <-lease:
			c.renewLeases(ctx)
		case <-ctx.Done():
			return stopped
		}
	}
}

func await(ctx context.Context, msg *message.Message, c chores) outcome {
	for {
		flush, lease := dueOf(c)
		select {
		case <-msg.Acked():
			return acked
		case <-msg.Nacked():
			return nacked
		case <-flush:
			c.flushWhileBusy(ctx)
		case <-lease:
			c.renewLeases(ctx)
		case <-ctx.Done():
			select {
			case <-msg.Acked():
				return ackedThenStopped // so that Close still sends the Ack
			default:
				return stopped
			}
		}
	}
}

// pause waits for d or until ctx ends, doing c's chores meanwhile, and
// reports whether d passed.
func pause(ctx context.Context, d time.Duration, c chores) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		flush, lease := dueOf(c)
		select {
		case <-t.C:
			return true
		case <-flush:
			c.flushWhileBusy(ctx)
		case <-lease:
			c.renewLeases(ctx)
		case <-ctx.Done():
			return false
		}
	}
}

func dueOf(c chores) (flush, lease <-chan time.Time) {
	if c == nil {
		return nil, nil
	}
	return c.flushDue(), c.leaseDue()
}

// retries paces one loop's retries after failed calls to the server: it
// counts the failure, logs it, and waits a backoff that grows with each
// consecutive failure (doing c's chores meanwhile).
type retries struct {
	sub    *Subscriber
	logger watermill.LoggerAdapter
	n      int // consecutive failures
}

// fail records a failed call and waits before the next try. It returns false
// when ctx ended during the wait.
func (r *retries) fail(ctx context.Context, what string, err error, c chores) bool {
	r.sub.stats.faults.Add(1)
	r.n++
	delay := backoff(r.n)
	// A failover may be under way: have the client look for the new master,
	// and do not sleep long past its arrival.
	delay = r.sub.failover.retryDelay(r.sub.config.Client, err, delay)
	r.logger.Error("Stream call failed; retrying", err, watermill.LogFields{
		"operation": what, "attempt": r.n, "retry_in": delay.String()})
	return pause(ctx, delay, c)
}

// succeeded ends a streak of failures.
func (r *retries) succeeded() {
	if r.n > 0 {
		r.logger.Info("Stream calls resumed", watermill.LogFields{"failed_attempts": r.n})
		r.n = 0
	}
}

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
