package valkeystream

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ackBatch holds the ids a handler Acked that are not sent yet, and when they
// are due: an Ack waits at most every (AckFlushInterval) for later ones to
// share its XACK, or less at the handler's pace (see pace); with every
// negative it is due at once. After a failed send the ids
// are kept and due again after a backoff.
type ackBatch struct {
	ids    []string
	every  time.Duration
	wait   time.Duration // how long an Ack waits: every, or less (see pace)
	timer  *time.Timer   // fires when the oldest id is due
	faults int           // consecutive failed sends
}

func newAckBatch(every time.Duration) ackBatch {
	return ackBatch{every: every, wait: every, timer: stoppedTimer()}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// How long an Ack waits for later ones to share its XACK, besides
// AckFlushInterval, follows the handler's pace: the time it takes to settle
// ackWaitSettles messages, and at least ackWaitMin. A fast handler's Acks
// mostly ride the reads, or share an XACK with many others; a slower one's
// go out every few messages, while it works on the next (the XACK does not
// hold the loop up, see sendAcks), so that a crash leaves few handled
// entries unacknowledged, to be handled again.
const (
	ackWaitSettles = 2
	ackWaitMin     = time.Millisecond
)

// pace sets how long an Ack waits from settle, the time the handler takes
// per message (zero: unknown).
func (b *ackBatch) pace(settle time.Duration) {
	b.wait = b.every
	if b.every > 0 && settle > 0 {
		b.wait = min(b.every, max(ackWaitSettles*settle, ackWaitMin))
	}
}

// add keeps id to be sent.
func (b *ackBatch) add(id string) {
	b.ids = append(b.ids, id)
	if len(b.ids) == 1 {
		b.timer.Reset(max(b.wait, 0))
	}
}

// len returns how many ids wait to be sent.
func (b *ackBatch) len() int { return len(b.ids) }

// atOnce reports whether each Ack is to be sent as soon as it is made.
func (b *ackBatch) atOnce() bool { return b.every < 0 }

// due returns the channel that fires when the held ids are due, or nil when
// there are none.
func (b *ackBatch) due() <-chan time.Time {
	if len(b.ids) == 0 {
		return nil
	}
	return b.timer.C
}

// send queues the XACK of the held ids on c: a client sends it at once, a
// pipeline with its other commands. Every Ack the loop waits for goes
// through here, and its result through settle; one it does not wait for
// goes through sendTaken and settleTaken.
func (b *ackBatch) send(ctx context.Context, c redis.Cmdable, key, group string) *redis.IntCmd {
	return c.XAck(ctx, key, group, b.ids...)
}

// settle reads the result of send: on success it forgets the ids and returns
// how many entries the server acknowledged (those still pending); on failure
// it keeps them and returns the error.
func (b *ackBatch) settle(cmd *redis.IntCmd) (int64, error) {
	n, err := cmd.Result()
	if err != nil {
		return 0, fmt.Errorf("acknowledging %d entries: %w", len(b.ids), err)
	}
	b.ids = b.ids[:0]
	b.timer.Stop()
	b.faults = 0
	return n, nil
}

// rearm makes the held ids due at once, if there are any.
func (b *ackBatch) rearm() {
	if len(b.ids) > 0 {
		b.timer.Reset(0)
	}
}

// sendTaken queues the XACK of the held ids on pipe and removes them from
// the batch, for a round trip whose reply comes later (see settleTaken):
// Acks made meanwhile start a new batch. It returns the ids, and a nil
// command when there were none.
func (b *ackBatch) sendTaken(ctx context.Context, pipe redis.Pipeliner, key, group string) ([]string, *redis.IntCmd) {
	if len(b.ids) == 0 {
		return nil, nil
	}
	ids := b.ids
	b.ids = nil
	b.timer.Stop()
	return ids, pipe.XAck(ctx, key, group, ids...)
}

// settleTaken reads the result of sendTaken: on success it returns how many
// entries the server acknowledged; on failure it puts ids back, ahead of
// the ones held now, marks the failure (see failed) and returns the error.
func (b *ackBatch) settleTaken(ids []string, cmd *redis.IntCmd) (int64, error) {
	if cmd == nil {
		return 0, nil
	}
	n, err := cmd.Result()
	if err != nil {
		b.ids = append(ids, b.ids...)
		b.failed()
		return 0, fmt.Errorf("acknowledging %d entries: %w", len(ids), err)
	}
	return n, nil
}

// failed records a failed send made while the loop is busy (see settle): the
// ids are due again after a backoff that grows with each consecutive
// failure. It returns how many sends failed in a row.
func (b *ackBatch) failed() int {
	b.faults++
	b.timer.Reset(backoff(b.faults))
	return b.faults
}

// stop stops the timer, for good.
func (b *ackBatch) stop() { b.timer.Stop() }
