package loop

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// nackLogEvery bounds how often a subscription logs Nacks at Info level.
const nackLogEvery = 10 * time.Second

// nacked handles the Nack of msg, the message of e: it waits the Nack's
// delay, then claims e back (which grows its delivery count), and returns
// it to deliver again, or nil when it is not this consumer's to deliver any
// more. A Nacked entry comes back before any entry queued after it. It
// returns false when the subscription ended.
//
// A message its handler gave up on is dead-lettered and acknowledged
// instead (giveUp); one Nacked to come back after a delay of its own is
// deferred (deferNack): the loop goes on with the next entries, and
// delivers it again when it is due.
func (l *Group) nacked(ctx context.Context, msg *message.Message, e entry) (*entry, bool) {
	l.deps.Counters.Nacked.Add(1)
	v := verdictOf(msg)
	if l.cfg.Ordered {
		v.after = 0 // a retry-after would let the next entries pass it
	}
	if ctx.Err() != nil {
		// Nacked while the subscription ends: a peer takes it, when it is
		// due if it was deferred.
		if v.giveUp || v.after <= 0 || !l.deferNack(msg, e, v.after) {
			l.held.handBack(e.id)
		}
		return nil, false
	}
	switch {
	case v.giveUp && l.deps.Handling.GiveUp != nil:
		l.giveUp(ctx, msg, e, v.reason)
		return nil, true
	case v.after > 0 && l.deferNack(msg, e, v.after):
		return nil, true
	}
	delay := l.cfg.NackDelay(e.count)
	l.deps.Counters.nackWaited(delay)
	fields := watermill.LogFields{"message_uuid": msg.UUID, "entry_id": e.id, "delivery_count": e.count, "retry_in": delay.String()}
	if ok, held := l.nackLog.allow(time.Now()); ok {
		fields["nacks_not_logged"] = held
		l.deps.Logger.Info("Message nacked; delivering it again after a delay", fields)
	} else {
		l.deps.Logger.Trace("Message nacked; delivering it again after a delay", fields)
	}
	if !l.pause(ctx, delay) {
		return nil, false
	}
	return l.claimBackRetrying(ctx, e)
}

// claimBackRetrying claims e back (see claimBack), retrying after faults.
// It returns false when the subscription ended first.
func (l *Group) claimBackRetrying(ctx context.Context, e entry) (*entry, bool) {
	for {
		next, err := l.claimBack(ctx, e)
		if err == nil {
			l.retries.succeeded()
			return next, true
		}
		if ctx.Err() != nil || !l.fault(ctx, "claiming a nacked entry back", err) {
			return nil, false
		}
	}
}

// claimBack claims e, whose delivery was Nacked, back for this consumer.
// The server claims it only while its count is still that of the Nacked
// delivery, so a call that the client sends again (after a network error)
// does not grow the count twice.
func (l *Group) claimBack(ctx context.Context, e entry) (*entry, error) {
	r, err := l.deps.Server.ClaimBack(ctx, e.id, e.count)
	if err != nil {
		return nil, err
	}
	switch r.Status {
	case "ok":
		return &entry{id: e.id, fields: r.Fields, count: r.Count}, nil
	case "gone":
		l.deps.Logger.Debug("Nacked entry is no longer pending, not delivering it again", watermill.LogFields{"entry_id": e.id})
	case "taken":
		l.deps.Logger.Info("Nacked entry was taken over by another consumer meanwhile; leaving it to that consumer",
			watermill.LogFields{"entry_id": e.id})
	case "missing":
		l.reportMissing(e.id, true)
	}
	return nil, nil
}
