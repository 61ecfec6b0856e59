package valkeystream

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ackBatch holds the ids a handler Acked that are not sent yet, and when they
// are due: an Ack waits at most every (AckFlushInterval) for later ones to
// share its XACK; with every negative it is due at once. After a failed send
// the ids are kept and due again after a backoff.
type ackBatch struct {
	ids    []string
	every  time.Duration
	timer  *time.Timer // fires when the oldest id is due
	faults int         // consecutive failed sends
}

func newAckBatch(every time.Duration) ackBatch {
	return ackBatch{every: every, timer: stoppedTimer()}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// add keeps id to be sent.
func (b *ackBatch) add(id string) {
	b.ids = append(b.ids, id)
	if len(b.ids) == 1 {
		b.timer.Reset(max(b.every, 0))
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
// pipeline with its other commands. Every Ack the loop sends goes through
// here, and its result through settle.
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
