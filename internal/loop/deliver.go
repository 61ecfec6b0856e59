package loop

import (
	"context"
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
		if err != nil {
			l.deadLetter(ctx, e, err)
			return true
		}
		msg.Metadata.Set(MetadataDeliveryCount, strconv.FormatInt(e.count, 10))
		msgCtx, cancel := context.WithCancel(msgBase)
		msg.SetContext(msgCtx)
		result := l.deliver(ctx, msg)
		cancel()
		switch result {
		case acked:
			l.acks.add(e.id)
			if l.acks.atOnce() {
				_ = l.acks.flush(ctx, l.deps.Server)
			}
			return true
		case ackedThenStopped:
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
			if l.deps.Delivered != nil {
				l.deps.Delivered(l.held.inFlight)
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
	e.msg, e.decodeErr = l.deps.Decode(Entry{ID: e.id, Fields: e.fields})
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
	if err := l.deps.DeadLetter(ctx, Entry{ID: e.id, Fields: e.fields}, e.count, decodeErr); err != nil {
		l.deps.Counters.Faults.Add(1)
		return
	}
	l.acks.add(e.id)
	l.deps.Counters.InvalidEntries.Add(1)
}
