package loop

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Reads sent ahead. Without them a loop reads new entries only once its
// queue is empty, so every batch costs the handler a round trip of waiting:
// nothing at loopback, half the time at a millisecond from the server. So
// while the handler settles the last queued entries, the loop already sends
// the next read (with the Acks held, as readNew does): it starts when what
// is left in the queue would be settled within one round trip of a read, at
// the handler's measured pace. It asks for what prefetch allows, as any read
// of new entries does, and only a handler that settles two or more entries
// per PrefetchWindow gets one: a slow handler still reads one entry at a
// time, after the one before is settled, so a backlog still spreads over the
// consumers. One such round trip is on its way at most (see docs/design.md,
// "One read on its way"). Within it, up to maxAheadBatches reads of at most
// BatchSize each run in order, as many as the handler settles in a round
// trip, so a fast handler far from the server is not bound to one batch per
// round trip. What is queued counts against ReadAheadBytes, so a loop holds
// about a round trip's worth of entries plus one batch, and no more bytes
// than without reads sent ahead.

// maxAheadBatches is how many reads one round trip sent ahead holds at most.
const maxAheadBatches = 4

// ahead owns a loop's reads sent ahead and what paces them.
type ahead struct {
	trip *trip         // on its way, or nil
	err  error         // how the last one failed, to handle once the queue is empty
	rtt  time.Duration // moving average of a non-blocking read's round trip
	more bool          // the last read of new entries got all it asked for: more may wait
}

// measure records the round trip of a read that did not block.
func (a *ahead) measure(d time.Duration) {
	if a.rtt == 0 {
		a.rtt = d
	} else {
		a.rtt += (d - a.rtt) / 8
	}
}

// counts returns the counts of the reads to send ahead now, or none: only
// when none is on its way, the last read got all it asked for (so more
// entries may wait), and queued (what the loop holds) is no more than what
// the handler settles in one round trip of a read, each read of what
// prefetch allows (at least 2), as many as cover that round trip, within
// room (what else fits in ReadAheadBytes).
func (a *ahead) counts(queued int64, p *prefetch) []int64 {
	if a.trip != nil || !a.more || a.rtt <= 0 {
		return nil
	}
	due := p.settledWithin(a.rtt)
	if queued > due {
		return nil // the common case under load: checked before the rest
	}
	n := p.count()
	if n < 2 {
		return nil
	}
	total := min(max(due, n), maxAheadBatches*n, p.room(queued))
	var counts []int64
	for asked := int64(0); asked < total; asked += counts[len(counts)-1] {
		counts = append(counts, min(n, total-asked))
	}
	return counts
}

// readAhead sends the next reads of new entries if the loop is due them (see
// ahead.counts) and its plan's next step is a read, with the Acks held.
func (l *Group) readAhead(ctx context.Context) {
	counts := l.ahead.counts(int64(len(l.held.queue)), &l.pre)
	if len(counts) == 0 || l.plan.next(time.Now()) != stepRead {
		return
	}
	l.ahead.trip = startTrip(ctx, l.deps.Server, Trip{Acks: l.acks.take(), Reads: counts})
}

// landAhead waits for the reads on their way, if any, and queues what they
// brought. A failed Ack keeps its ids to be sent again; either failure is
// returned, as a failed fetch is: entries the reads may have taken are
// pending for this consumer and come back with the drain that follows.
func (l *Group) landAhead() error {
	t := l.ahead.trip
	if t == nil {
		return nil
	}
	<-t.done
	l.ahead.trip = nil
	l.ahead.measure(time.Since(t.sent))
	ackErr := l.acks.landed(t.req.Acks, t.reply)
	holding := l.held.holding()
	n := l.enqueueNew(t.reply.Entries)
	var err error
	if t.reply.ReadErr != nil {
		err = fmt.Errorf("reading new entries: %w", t.reply.ReadErr)
	}
	l.ahead.more = err == nil && t.reply.Full
	if n > 0 && !holding {
		l.hold.start()
	}
	return errors.Join(ackErr, err)
}

// landWhileBusy lands the reads on their way while the loop delivers; a
// failure waits to be handled as a failed fetch once the queue is empty.
func (l *Group) landWhileBusy() {
	if err := l.landAhead(); err != nil {
		l.ahead.err = errors.Join(l.ahead.err, err)
	}
}

// landAheadOnExit waits for the reads on their way, if any, when the loop
// ends: what they brought goes back (see leave), the Acks that failed are
// sent again.
func (l *Group) landAheadOnExit() {
	if err := l.landAhead(); err != nil {
		l.deps.Counters.Faults.Add(1)
		l.deps.Logger.Error("A read of new entries failed as the subscription ended; entries it may have taken come back to this consumer name or to a peer after ClaimMinIdle", err, nil)
	}
}
