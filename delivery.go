package valkeystream

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// closeFlushTimeout bounds how long Close waits for the last Acks to reach
// the server (see [Subscriber.Close]).
const closeFlushTimeout = 5 * time.Second

// outcome is how a delivery ended.
type outcome int

const (
	stopped          outcome = iota // ctx ended first; the message was not Acked
	acked                           // the handler Acked it
	nacked                          // the handler Nacked it
	ackedThenStopped                // it was Acked, and ctx has ended
	lost                            // not handed over: the entry is not this consumer's any more
	unsent                          // not handed over: ctx ended first
)

// event is what ended a wait.
type event int

const (
	evStopped event = iota // ctx ended
	evSent                 // the handler took the message
	evAcked
	evNacked
	evTimer   // the delay passed
	evFlush   // Acks are due
	evRenew   // the hold on held entries is due for renewal
	evRead    // a read sent ahead has its reply
	evAckSent // an XACK sent while delivering has its reply
)

// waits is what a loop waits for; a nil channel never fires. Every wait of a
// loop (to hand a message over, for its Ack or Nack, for a delay) is one call
// of next, and the loop itself does what the event asks before it waits
// again: nothing runs behind its back.
type waits struct {
	out     chan<- *message.Message // hand msg over here, until sent
	msg     *message.Message
	acked   <-chan struct{} // msg.Acked(), once sent
	nacked  <-chan struct{}
	timer   <-chan time.Time
	flush   <-chan time.Time
	renew   <-chan time.Time
	read    <-chan struct{}
	ackSent <-chan struct{}
}

// next blocks until one of w's channels fires or ctx ends.
func (w *waits) next(ctx context.Context) event {
	select {
	case w.out <- w.msg:
		return evSent
	case <-w.acked:
		return evAcked
	case <-w.nacked:
		return evNacked
	case <-w.timer:
		return evTimer
	case <-w.flush:
		return evFlush
	case <-w.renew:
		return evRenew
	case <-w.read:
		return evRead
	case <-w.ackSent:
		return evAckSent
	case <-ctx.Done():
		return evStopped
	}
}

// sent records that the handler took the message: from now on the wait is
// for its Ack or Nack.
func (w *waits) sent() {
	w.out = nil
	w.acked, w.nacked = w.msg.Acked(), w.msg.Nacked()
}

// stopped is the outcome of a delivery whose ctx ended: an Ack that was made
// meanwhile is still reported, so that Close sends it.
func (w *waits) stopped() outcome {
	if w.acked != nil {
		select {
		case <-w.acked:
			return ackedThenStopped
		default:
		}
	}
	return stopped
}

// sleep waits for d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	w := waits{timer: t.C}
	return w.next(ctx) == evTimer
}
