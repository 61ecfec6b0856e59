package loop

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The metadata keys with which a handler tells the loop, on a Nack, what to
// do with the message (valkeystream.RetryAfter, NackAfter, GiveUp, Reject).
// A value published under either key is removed on delivery.
const (
	// MetadataRetryAfter holds how long the Nacked message waits before it
	// comes back, as a Go duration ("30s"), while the next ones flow on.
	MetadataRetryAfter = "valkeystream_retry_after"
	// MetadataGiveUp holds why the handler gave up on the message: on a
	// Nack, it is dead-lettered at once and acknowledged.
	MetadataGiveUp = "valkeystream_give_up"
)

// verdict is what a handler asked of a message it Nacked.
type verdict struct {
	giveUp bool
	reason string
	after  time.Duration // > 0: come back after this long
}

// verdictOf reads the verdict msg carries. Give up wins over a retry; a
// retry-after that does not parse as a positive duration is a plain Nack.
func verdictOf(msg *message.Message) verdict {
	if reason, ok := msg.Metadata[MetadataGiveUp]; ok {
		return verdict{giveUp: true, reason: reason}
	}
	if d, err := time.ParseDuration(msg.Metadata.Get(MetadataRetryAfter)); err == nil && d > 0 {
		return verdict{after: d}
	}
	return verdict{}
}

// clearVerdict removes the verdict keys from a message about to be
// delivered: only its handler gives one.
func clearVerdict(msg *message.Message) {
	delete(msg.Metadata, MetadataGiveUp)
	delete(msg.Metadata, MetadataRetryAfter)
}

// GiveUpFunc deals with a message its handler gave up on, delivered count
// times: it copies it to the dead-letter stream (or logs it), and logs what
// it did; an error leaves the entry pending, to come back.
type GiveUpFunc func(ctx context.Context, msg *message.Message, count int64, reason string) error

// giveUp deals with e, whose handler gave up on it (Deps.GiveUp), and
// acknowledges it; if that fails, the entry stays pending and comes back
// through a claim after ClaimMinIdle, as an undecodable entry does.
func (l *Group) giveUp(ctx context.Context, msg *message.Message, e entry, reason string) {
	if err := l.deps.Handling.GiveUp(ctx, msg, e.count, reason); err != nil {
		l.deps.Counters.Faults.Add(1)
		return
	}
	l.acks.add(e.id)
	l.deps.Counters.Nacks.GivenUp.Add(1)
	if l.acks.atOnce() {
		l.acks.failed(l.acks.flush(ctx, l.deps.Server))
	}
}

// deferNack keeps e, Nacked with a retry-after of d, in the deferred set,
// and reports whether it had room.
func (l *Group) deferNack(msg *message.Message, e entry, d time.Duration) bool {
	if !l.later.add(e.id, e.count, time.Now().Add(d)) {
		l.deps.Counters.Nacks.LaterFallbacks.Add(1)
		l.deps.Logger.Trace("Deferred set full; the nacked message waits the Nack delay instead",
			watermill.LogFields{"message_uuid": msg.UUID, "entry_id": e.id, "deferred": l.later.len()})
		return false
	}
	l.deps.Counters.Nacks.RetriesLater.Add(1)
	l.hold.start()
	l.deps.Logger.Trace("Message nacked to come back later; delivering the next ones meanwhile",
		watermill.LogFields{"message_uuid": msg.UUID, "entry_id": e.id, "delivery_count": e.count, "retry_in": d.String()})
	return true
}

// comeBack claims back d, a deferred entry now due (which grows its
// delivery count), and delivers it. It returns false when the subscription
// ended.
func (l *Group) comeBack(ctx, msgBase context.Context, d deferredEntry) bool {
	next, ok := l.claimBackRetrying(ctx, entry{id: d.id, count: d.count})
	if !ok {
		// Still pending here: leave hands it back, due now.
		l.later.add(d.id, d.count, d.due)
		return false
	}
	if next == nil {
		return true
	}
	l.deps.Counters.InFlight.Add(1)
	defer l.deps.Counters.InFlight.Add(-1)
	return l.handle(ctx, msgBase, *next)
}
