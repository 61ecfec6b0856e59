package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// allocCount is how many heap objects and bytes a process allocated.
type allocCount struct{ objects, bytes uint64 }

// A tracker keeps the books of one consume run: which messages of the corpus
// were delivered and which succeeded (were Acked), how often, and when. It is
// safe for concurrent use, since a router may run handlers concurrently.
type tracker struct {
	n, size int
	start   time.Time

	deliveries []atomic.Uint32 // per sequence number
	successes  []atomic.Uint32 // per sequence number

	delivered  atomic.Int64 // deliveries of corpus messages, redeliveries included
	succeeded  atomic.Int64 // distinct messages that succeeded
	duplicates atomic.Int64 // successes beyond the first of a message
	invalid    atomic.Int64 // deliveries no corpus message could have made
	nacked     atomic.Int64

	lastFirst   atomic.Int64 // nanoseconds from start to the latest first delivery
	lastSuccess atomic.Int64 // nanoseconds from start to the latest first success

	// Nack to redelivery, in nanoseconds: when each message was last Nacked
	// (0: not waiting), and the sum, count and most of the waits.
	nackedAt      []atomic.Int64
	redeliverySum atomic.Int64
	redeliveries  atomic.Int64
	redeliveryMax atomic.Int64

	done     chan struct{} // closed when every message succeeded
	doneOnce sync.Once
}

// newTracker returns the books for consuming c; withNacks keeps the times
// from Nack to redelivery too.
func newTracker(c corpus, withNacks bool) *tracker {
	t := &tracker{
		n:          c.n,
		size:       c.size,
		deliveries: make([]atomic.Uint32, c.n),
		successes:  make([]atomic.Uint32, c.n),
		done:       make(chan struct{}),
	}
	if withNacks {
		t.nackedAt = make([]atomic.Int64, c.n)
	}
	return t
}

// begin starts the clock.
func (t *tracker) begin() { t.start = time.Now() }

// deliver records a delivery of the message with this payload. It returns
// the message's sequence number and whether this is its first delivery; ok is
// false (and the delivery counted as invalid) for a payload that is not from
// the corpus.
func deliver[P ~string | ~[]byte](t *tracker, payload P) (seq int, first, ok bool) {
	seq, ok = parseSeq(payload)
	if !ok || seq >= t.n || len(payload) != t.size {
		t.invalid.Add(1)
		return 0, false, false
	}
	t.delivered.Add(1)
	now := int64(time.Since(t.start))
	first = t.deliveries[seq].Add(1) == 1
	if first {
		storeMax(&t.lastFirst, now)
	} else if t.nackedAt != nil {
		if at := t.nackedAt[seq].Swap(0); at != 0 {
			t.redeliverySum.Add(now - at)
			t.redeliveries.Add(1)
			storeMax(&t.redeliveryMax, now-at)
		}
	}
	return seq, first, true
}

// nack records that message seq is about to be Nacked.
func (t *tracker) nack(seq int) {
	t.nacked.Add(1)
	if t.nackedAt != nil {
		t.nackedAt[seq].Store(max(1, int64(time.Since(t.start))))
	}
}

// redeliveryWait is the mean and the longest time from a Nack to the
// message's next delivery.
func (t *tracker) redeliveryWait() (mean, longest time.Duration) {
	n := t.redeliveries.Load()
	if n == 0 {
		return 0, 0
	}
	return time.Duration(t.redeliverySum.Load() / n), time.Duration(t.redeliveryMax.Load())
}

// succeed records that message seq was handled successfully (is about to be
// Acked).
func (t *tracker) succeed(seq int) {
	if t.successes[seq].Add(1) > 1 {
		t.duplicates.Add(1)
		return
	}
	storeMax(&t.lastSuccess, int64(time.Since(t.start)))
	if t.succeeded.Add(1) == int64(t.n) {
		t.doneOnce.Do(func() { close(t.done) })
	}
}

// wait returns when every message succeeded, or an error when ctx ends (its
// cause) or no message succeeded for stall.
func (t *tracker) wait(ctx context.Context, stall time.Duration) error {
	tick := time.NewTicker(stall / 10)
	defer tick.Stop()
	last, lastChange := t.succeeded.Load(), time.Now()
	for {
		select {
		case <-t.done:
			if bad := t.invalid.Load(); bad > 0 {
				return fmt.Errorf("%d deliveries carried a payload that no published message had", bad)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%w, with %s", context.Cause(ctx), t.missing())
		case <-tick.C:
			now := t.succeeded.Load()
			if now != last {
				last, lastChange = now, time.Now()
			} else if time.Since(lastChange) >= stall {
				return fmt.Errorf("no progress for %s: %s", stall, t.missing())
			}
		}
	}
}

func (t *tracker) missing() string {
	got := t.succeeded.Load()
	return fmt.Sprintf("%d of %d messages succeeded, %d missing (%d invalid deliveries, %d duplicates)",
		got, t.n, int64(t.n)-got, t.invalid.Load(), t.duplicates.Load())
}

// elapsed is the time from begin to the last first success.
func (t *tracker) elapsed() time.Duration { return time.Duration(t.lastSuccess.Load()) }

// tail is the time from the last first delivery to the last first success:
// how long the redeliveries of Nacked messages trailed behind.
func (t *tracker) tail() time.Duration {
	return max(0, time.Duration(t.lastSuccess.Load()-t.lastFirst.Load()))
}

func storeMax(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}
