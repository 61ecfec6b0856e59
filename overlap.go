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
// consumers. One such read is on its way at most (maxAheadReads), and the
// entries queued and coming count against ReadAheadBytes, so a loop holds
// at most a round trip's worth of entries plus one read, and no more bytes
// than without overlapping.

// aheadRead is a read of new entries sent while the loop still delivers.
// Its goroutine only sends it and closes done; the loop reads its results.
type aheadRead struct {
	done  chan struct{}
	acked []string // the Acks sent with it
	ack   *redis.IntCmd
	reads []*redis.XStreamSliceCmd // in stream order: one connection, one pipeline
	sent  time.Time
	asked int64 // by all its reads
}

// maxAheadReads is how many pipelines of reads sent ahead may be on their
// way at once. One: two on two connections may reach the server in either
// order, and the later one would then bring the earlier entries. Within the
// one pipeline, reads run in order; a pipeline holds up to maxAheadBatches
// reads of at most BatchSize each, as many as the handler settles in a
// round trip, so a fast handler far from the server is not bounded by one
// read per round trip.
const (
	maxAheadReads   = 1
	maxAheadBatches = 4
)

// aheadTimeout bounds a read that overlaps handling: it does not block, so
// only a server or network fault makes it last.
const aheadTimeout = 30 * time.Second

// readAhead sends a read of new entries if the loop is due one: its plan's
// next step is a read, the last read got all it asked for (so more entries
// may wait), no such read is on its way, its handler is fast
// enough to be given more than one entry per read, and the entries queued
// and on their way are no more than what the handler settles in one round
// trip of a read. It sends, in one pipeline, as many reads of what prefetch
// allows as cover what the handler settles in a round trip (at least one,
// at most maxAheadBatches), within ReadAheadBytes.
func (l *groupLoop) readAhead(ctx context.Context) {
	if len(l.ahead) >= maxAheadReads || !l.more || l.readRTT <= 0 || l.plan.next(time.Now()) != stepRead {
		return
	}
	n := l.prefetch.count()
	coming := int64(len(l.queue))
	for _, r := range l.ahead {
		coming += r.asked
	}
	if n < 2 || coming > l.prefetch.settledWithin(l.readRTT) {
		return
	}
	// What is queued or coming counts against ReadAheadBytes too.
	if n = min(n, l.prefetch.room(coming)); n < 1 {
		return
	}
	// As many reads as the handler settles entries in a round trip, each
	// of at most n.
	total := min(l.prefetch.settledWithin(l.readRTT), maxAheadBatches*n, l.prefetch.room(coming))
	r := &aheadRead{done: make(chan struct{}), acked: l.acks.take(), sent: time.Now()}
	// The reads must reach their end even when the subscription ends, so
	// that the entries they took are known and handed back (see landAhead).
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), aheadTimeout)
	pipe := l.client.Pipeline()
	if len(r.acked) > 0 {
		r.ack = pipe.XAck(rctx, l.key, l.group, r.acked...)
	}
	for {
		args := l.readArgs(-1)
		args.Count = n
		r.reads = append(r.reads, pipe.XReadGroup(rctx, args))
		r.asked += n
		if r.asked >= total {
			break
		}
		n = min(n, total-r.asked)
	}
	l.ahead = append(l.ahead, r)
	go func() {
		defer close(r.done)
		defer cancel()
		_, _ = pipe.Exec(rctx) // each command carries its own error
	}()
}

// aheadDone returns the channel that is closed when the read on its way
// has its reply, or nil when there is none.
func (l *groupLoop) aheadDone() <-chan struct{} {
	if len(l.ahead) == 0 {
		return nil
	}
	return l.ahead[0].done
}

// landAhead waits for the read on its way, if any, and queues what it
// brought. A failed Ack keeps its ids to be sent again; either failure is
// returned, as a failed fetch is: entries the read may have taken are pending
// for this consumer and come back with the drain that follows.
func (l *groupLoop) landAhead() error {
	if len(l.ahead) == 0 {
		return nil
	}
	r := l.ahead[0]
	<-r.done
	l.ahead = l.ahead[1:]
	l.measureRead(time.Since(r.sent))
	var ackErr error
	if r.ack != nil {
		n, err := r.ack.Result()
		if err != nil {
			l.acks.restore(r.acked)
			ackErr = fmt.Errorf("acknowledging %d entries: %w", len(r.acked), err)
		} else {
			l.sub.stats.acked.Add(n)
		}
	}
	holding := len(l.queue) > 0 || l.inFlight != ""
	var got int64
	var err error
	for _, read := range r.reads {
		streams, rerr := read.Result()
		if rerr != nil && !errors.Is(rerr, redis.Nil) {
			// The reads after it may have taken entries: they are pending
			// for this consumer and come back with the drain that follows.
			err = fmt.Errorf("reading new entries: %w", rerr)
			break
		}
		got += int64(l.enqueueNew(streams))
	}
	l.more = err == nil && got == r.asked
	if got > 0 && !holding {
		l.lease.start()
	}
	return errors.Join(ackErr, err)
}

// landWhileBusy lands the read on its way while the loop delivers; a
// failure waits to be handled as a failed fetch once the queue is empty.
func (l *groupLoop) landWhileBusy() {
	if err := l.landAhead(); err != nil {
		l.aheadErr = errors.Join(l.aheadErr, err)
	}
}

// landAheadOnExit waits for the read on its way, if any, when the loop
// ends: what it brought goes back (see flushOnExit), the Acks it failed to
// send are sent again.
func (l *groupLoop) landAheadOnExit() {
	for len(l.ahead) > 0 {
		if err := l.landAhead(); err != nil {
			l.sub.stats.faults.Add(1)
			l.logger.Error("A read of new entries failed as the subscription ended; entries it may have taken come back to this consumer name or to a peer after ClaimMinIdle", err, nil)
		}
	}
}

// measureRead records the round trip of a read that did not block, which
// paces the reads sent ahead and the Acks (see ackBatch.pace).
func (l *groupLoop) measureRead(d time.Duration) {
	if l.readRTT == 0 {
		l.readRTT = d
	} else {
		l.readRTT += (d - l.readRTT) / 8
	}
}

// ackSend is an XACK of held Acks sent while the loop delivers, so that
// sending them does not hold up the next hand-over. Its goroutine only sends
// it and closes done; the loop reads its result.
type ackSend struct {
	done chan struct{}
	ids  []string
	cmd  *redis.IntCmd
}

// sendAcks sends the held Acks without waiting for the reply (see landAcks).
// While an XACK is on its way, Acks that come due wait for its reply.
func (l *groupLoop) sendAcks(ctx context.Context) {
	if l.sending != nil {
		l.ackDue = true
		return
	}
	if l.acks.len() == 0 {
		return
	}
	r := &ackSend{done: make(chan struct{}), ids: l.acks.take()}
	l.sending = r
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), aheadTimeout)
	go func() {
		defer close(r.done)
		defer cancel()
		r.cmd = l.client.XAck(rctx, l.key, l.group, r.ids...)
	}()
}

// sendingDone returns the channel that is closed when the XACK on its way
// has its reply, or nil when there is none.
func (l *groupLoop) sendingDone() <-chan struct{} {
	if l.sending == nil {
		return nil
	}
	return l.sending.done
}

// landAcks waits for the XACK on its way, if any. A failure keeps its ids,
// to send again after a backoff; Acks that came due meanwhile are sent.
func (l *groupLoop) landAcks() {
	r := l.sending
	if r == nil {
		return
	}
	<-r.done
	l.sending = nil
	n, err := r.cmd.Result()
	if err != nil {
		l.acks.restore(r.ids)
		l.sub.stats.faults.Add(1)
		if l.acks.faults == 1 {
			l.logger.Error("Sending acks failed; keeping them to send again", err, nil)
		}
		l.ackDue = false
		return
	}
	l.sub.stats.acked.Add(n)
	if l.ackDue {
		l.ackDue = false
		l.acks.rearm()
	}
}
