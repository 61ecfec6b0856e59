package loop

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// MetadataDeliveryCount is the metadata key of a delivered message's
// delivery count (valkeystream.MetadataDeliveryCount).
const MetadataDeliveryCount = "valkeystream_delivery_count"

// handle delivers e until it is Acked, redelivering it after each Nack, with
// message contexts derived from msgBase. It returns false when the
// subscription ended.
func (l *Group) handle(ctx, msgBase context.Context, e entry) bool {
	l.held.inFlight = e.id
	defer func() { l.held.inFlight = "" }()
	for {
		msg, err := l.decode(&e)
		if errors.Is(err, ErrNotForThisGroup) {
			l.acks.add(e.id)
			if l.deps.Handling.NotForThisGroup != nil {
				l.deps.Handling.NotForThisGroup()
			}
			return true
		}
		if err != nil {
			l.deadLetter(ctx, e, err)
			return true
		}
		msg.Metadata.Set(MetadataDeliveryCount, strconv.FormatInt(e.count, 10))
		clearVerdict(msg)
		withDelivery, delivery := l.withDelivery(msgBase, &e)
		msgCtx, cancel := context.WithCancel(withDelivery)
		msg.SetContext(msgCtx)
		result := l.deliver(ctx, msg)
		cancel()
		switch result {
		case acked:
			if delivery.Settled() {
				l.settled(delivery)
				return true
			}
			l.acks.add(e.id)
			if l.acks.atOnce() {
				l.acks.failed(l.acks.flush(ctx, l.deps.Server))
			}
			return true
		case ackedThenStopped:
			if delivery.Settled() {
				l.settled(delivery)
				return false
			}
			l.acks.add(e.id)
			return false
		case stopped:
			return false
		case unsent:
			// No handler has seen it: a peer takes it.
			l.held.handBack(e.id)
			return false
		case lost:
			return true
		}
		next, ok := l.nacked(ctx, msg, e)
		if !ok {
			return false
		}
		if next == nil {
			return true
		}
		e = *next
	}
}

// deliver hands msg, the message of the entry in flight, to the handler and
// waits until it is Acked or Nacked, doing the loop's background work
// meanwhile. An entry that a hold beat finds taken over by another consumer
// before the handler took it is not handed over (lost). When ctx ends
// while the handler has the message, it waits up to CloseGrace more for the
// Ack or Nack.
func (l *Group) deliver(ctx context.Context, msg *message.Message) outcome {
	w := waits{out: l.out, msg: msg}
	closing := false
	for {
		l.arm(&w)
		ev := w.next(ctx)
		if handled, taken := l.background(ctx, ev); handled {
			if taken && w.out != nil {
				l.deps.Logger.Info("The entry waiting to be delivered was taken over by another consumer; not delivering it",
					watermill.LogFields{"entry_id": l.held.inFlight})
				return lost
			}
			continue
		}
		switch ev {
		case evSent:
			l.pre.handedOver(time.Now())
			l.deps.Counters.Delivered.Add(1)
			if l.deps.Handling.Delivered != nil {
				l.deps.Handling.Delivered(l.held.inFlight)
			}
			w.sent()
			l.decodeNext()
		case evAcked:
			l.pre.settled(time.Now())
			l.acks.pace(l.pre.avg)
			if closing {
				return ackedThenStopped
			}
			return acked
		case evNacked:
			l.pre.settled(time.Now())
			return nacked
		case evStopped:
			if w.out != nil {
				return unsent
			}
			if closing || l.cfg.CloseGrace < 0 {
				return w.stopped()
			}
			// The handler has it: the calls made while it finishes get
			// CloseGrace, as the wait does.
			closing = true
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), l.cfg.CloseGrace)
			defer cancel()
		}
	}
}

// decode returns e's message, decoded ahead (see decodeNext) or now.
func (l *Group) decode(e *entry) (*message.Message, error) {
	if !e.decoded {
		l.prepare(e)
	}
	msg, err := e.msg, e.decodeErr
	e.msg, e.decodeErr, e.decoded = nil, nil, false
	return msg, err
}

func (l *Group) prepare(e *entry) {
	e.decoded = true
	e.msg, e.decodeErr = l.deps.Handling.Decode(Entry{ID: e.id, Fields: e.fields})
}

// decodeNext decodes the next queued entry while the handler works on the
// message just handed over, so that decoding is off the path from one
// message to the next.
func (l *Group) decodeNext() {
	if len(l.held.queue) > 0 && !l.held.queue[0].decoded {
		l.prepare(&l.held.queue[0])
	}
}

// deadLetter deals with an entry that cannot be decoded (Deps.DeadLetter)
// and acknowledges it; if that fails, the entry stays pending and comes
// back with the next drain or reclaim.
func (l *Group) deadLetter(ctx context.Context, e entry, decodeErr error) {
	if err := l.deps.Handling.DeadLetter(ctx, Entry{ID: e.id, Fields: e.fields}, e.count, decodeErr); err != nil {
		l.deps.Counters.Faults.Add(1)
		return
	}
	l.acks.add(e.id)
	l.deps.Counters.InvalidEntries.Add(1)
}

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
	w.flush, w.hold = l.acks.due(), l.hold.due(l.held.holding() || l.later.len() > 0)
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

// settled counts the Ack of a settled delivery, which sends no XACK: in
// Acked too when its handling acknowledged the entry itself.
func (l *Group) settled(d *Delivery) {
	l.deps.Counters.Settled.Add(1)
	if d.acknowledged.Load() {
		l.deps.Counters.Acked.Add(1)
	}
}
