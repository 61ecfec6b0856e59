package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Overlapping reads. Without them a loop reads new entries only once its
// queue is empty, so every batch costs the handler a round trip of waiting:
// nothing at loopback, half the time at a millisecond from the server. So
// while the handler settles the last queued entries, the loop already sends
// the next read (with the Acks held, as readNew does): it starts when what
// is left in the queue would be settled within one round trip of a read, at
// the handler's measured pace. It asks for what prefetch allows, as any read
// of new entries does, and only a handler that settles two or more entries
// per PrefetchWindow gets one: a slow handler still reads one entry at a
// time, after the one before is settled, so a backlog still spreads over the
// consumers. One such round trip is on its way at most: two on two
// connections may reach the server in either order, and the later one would
// then bring the earlier entries. Within it, up to maxAheadBatches reads of
// at most BatchSize each run in order, as many as the handler settles in a
// round trip, so a fast handler far from the server is not bound to one
// batch per round trip. What is queued counts against ReadAheadBytes, so a
// loop holds about a round trip's worth of entries plus one batch, and no
// more bytes than without overlapping.
//
// Acks sent on their own (sendAcks) go the same way, in a round trip of
// their own that the loop does not wait for either.

// asyncTrip is one round trip sent while the loop delivers: the Acks held,
// and the reads of new entries, if any, in one pipeline. Its goroutine only
// sends it and closes done; the loop reads the results (land).
type asyncTrip struct {
	done  chan struct{}
	acked []string // the Acks sent with it
	ack   *redis.IntCmd
	reads []*redis.XStreamSliceCmd // in stream order
	asked int64                    // by all its reads
	sent  time.Time
}

// maxAheadBatches is how many reads one round trip sent ahead holds at most.
const maxAheadBatches = 4

// asyncTimeout bounds a round trip sent while the loop delivers: nothing in
// it blocks, so only a server or network fault makes it last.
const asyncTimeout = 30 * time.Second

// sendAsync sends the held Acks and reads of counts new entries (in order)
// in one pipeline, without waiting for the reply. The round trip reaches its
// end even when the subscription ends, so that the entries it took are known
// and handed back, and the Acks' outcome known.
func (l *groupLoop) sendAsync(ctx context.Context, counts ...int64) *asyncTrip {
	t := &asyncTrip{done: make(chan struct{}), sent: time.Now()}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), asyncTimeout)
	pipe := l.client.Pipeline()
	t.acked, t.ack = l.acks.sendTaken(rctx, pipe, l.key, l.group)
	for _, n := range counts {
		args := l.readArgs(-1)
		args.Count = n
		t.reads = append(t.reads, pipe.XReadGroup(rctx, args))
		t.asked += n
	}
	go func() {
		defer close(t.done)
		defer cancel()
		_, _ = pipe.Exec(rctx) // each command carries its own error
	}()
	return t
}

// landTripAcks reads the outcome of t's Acks: a failure keeps their ids, to be
// sent again after a backoff, and is returned.
func (l *groupLoop) landTripAcks(t *asyncTrip) error {
	n, err := l.acks.settleTaken(t.acked, t.ack)
	l.sub.stats.acked.Add(n)
	return err
}

// doneChan returns the channel that is closed when t has its reply, or nil when
// there is no t.
func (t *asyncTrip) doneChan() <-chan struct{} {
	if t == nil {
		return nil
	}
	return t.done
}

// readAhead sends the next reads of new entries if the loop is due them: its
// plan's next step is a read, the last read got all it asked for (so more
// entries may wait), no read is on its way, its handler is fast enough to be
// given more than one entry per read, and the queue holds no more than what
// the handler settles in one round trip of a read. It sends as many reads of
// what prefetch allows as cover what the handler settles in a round trip (at
// least one, at most maxAheadBatches), within ReadAheadBytes.
func (l *groupLoop) readAhead(ctx context.Context) {
	if l.ahead != nil || !l.more || l.readRTT <= 0 {
		return
	}
	queued := int64(len(l.queue))
	due := l.prefetch.settledWithin(l.readRTT)
	if queued > due {
		return // the common case under load: checked before the rest
	}
	n := l.prefetch.count()
	if n < 2 || l.plan.next(time.Now()) != stepRead {
		return
	}
	room := l.prefetch.room(queued) // what is queued counts against ReadAheadBytes too
	total := min(max(due, n), maxAheadBatches*n, room)
	var counts []int64
	for asked := int64(0); asked < total; asked += counts[len(counts)-1] {
		counts = append(counts, min(n, total-asked))
	}
	if len(counts) > 0 {
		l.ahead = l.sendAsync(ctx, counts...)
	}
}

// landAhead waits for the reads on their way, if any, and queues what they
// brought. A failed Ack keeps its ids to be sent again; either failure is
// returned, as a failed fetch is: entries the reads may have taken are
// pending for this consumer and come back with the drain that follows.
func (l *groupLoop) landAhead() error {
	t := l.ahead
	if t == nil {
		return nil
	}
	<-t.done
	l.ahead = nil
	l.measureRead(time.Since(t.sent))
	ackErr := l.landTripAcks(t)
	holding := len(l.queue) > 0 || l.inFlight != ""
	var got int64
	var err error
	for _, read := range t.reads {
		streams, rerr := read.Result()
		if rerr != nil && !errors.Is(rerr, redis.Nil) {
			// The reads after it may have taken entries: they are pending
			// for this consumer and come back with the drain that follows.
			err = fmt.Errorf("reading new entries: %w", rerr)
			break
		}
		got += int64(l.enqueueNew(streams))
	}
	l.more = err == nil && got == t.asked
	if got > 0 && !holding {
		l.lease.start()
	}
	return errors.Join(ackErr, err)
}

// landWhileBusy lands the reads on their way while the loop delivers; a
// failure waits to be handled as a failed fetch once the queue is empty.
func (l *groupLoop) landWhileBusy() {
	if err := l.landAhead(); err != nil {
		l.aheadErr = errors.Join(l.aheadErr, err)
	}
}

// landAheadOnExit waits for the reads on their way, if any, when the loop
// ends: what they brought goes back (see flushOnExit), the Acks that failed
// are sent again.
func (l *groupLoop) landAheadOnExit() {
	if err := l.landAhead(); err != nil {
		l.sub.stats.faults.Add(1)
		l.logger.Error("A read of new entries failed as the subscription ended; entries it may have taken come back to this consumer name or to a peer after ClaimMinIdle", err, nil)
	}
}

// measureRead records the round trip of a read that did not block, which
// paces the reads sent ahead.
func (l *groupLoop) measureRead(d time.Duration) {
	if l.readRTT == 0 {
		l.readRTT = d
	} else {
		l.readRTT += (d - l.readRTT) / 8
	}
}

// sendAcks sends the held Acks without waiting for the reply (see
// landAcks). While Acks are on their way, Acks that come due wait for
// their reply.
func (l *groupLoop) sendAcks(ctx context.Context) {
	switch {
	case l.sending != nil:
		l.ackDue = true
	case l.acks.len() > 0:
		l.sending = l.sendAsync(ctx)
	}
}

// landAcks waits for the Acks on their way, if any. A failure keeps their
// ids, to send again after a backoff; Acks that came due meanwhile are sent.
func (l *groupLoop) landAcks() {
	t := l.sending
	if t == nil {
		return
	}
	<-t.done
	l.sending = nil
	if err := l.landTripAcks(t); err != nil {
		l.ackDue = false
		l.sub.stats.faults.Add(1)
		if l.acks.faults == 1 {
			l.logger.Error("Sending acks failed; keeping them to send again", err, nil)
		}
		return
	}
	if l.ackDue {
		l.ackDue = false
		l.acks.rearm()
	}
}
