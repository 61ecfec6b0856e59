package loop

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

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
	evHold    // the hold on held entries is due
	evRead    // a read sent ahead has its reply
	evAckSent // an XACK sent on its own has its reply
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
	hold    <-chan time.Time
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
	case <-w.hold:
		return evHold
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

// arm sets the channels of the loop's background work in w: due Acks, the
// hold beat while it holds entries, the reads sent ahead and the Acks on
// their way.
func (l *Group) arm(w *waits) {
	w.flush, w.hold = l.acks.due(), l.hold.due(l.held.holding())
	w.read, w.ackSent = l.ahead.trip.doneChan(), l.acks.sent()
}

// background does the loop's background work that ev asks for, while it
// waits for a handler or a delay, and reports whether ev was one (else the
// caller handles it). taken reports a hold beat that found the entry in
// flight taken over by another consumer.
func (l *Group) background(ctx context.Context, ev event) (handled, taken bool) {
	switch ev {
	case evRead:
		l.landWhileBusy()
		l.decodeNext()
	case evAckSent:
		l.acks.land()
	case evFlush:
		l.acks.send(ctx, l.deps.Server)
	case evHold:
		taken = l.keepHold(ctx)
	default:
		return false, false
	}
	return true, taken
}

// pause waits for d or until ctx ends, doing the loop's background work
// meanwhile, and reports whether d passed.
func (l *Group) pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	w := waits{timer: t.C}
	for {
		l.arm(&w)
		ev := w.next(ctx)
		if ev == evTimer {
			return true
		}
		if handled, _ := l.background(ctx, ev); !handled {
			return false
		}
	}
}
