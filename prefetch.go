package valkeystream

import "time"

// prefetch sizes a group loop's reads by how fast its handler settles
// messages, so that a slow handler does not hoard entries that idle peers
// could handle, and a crash strands little: a read asks for what the handler
// is expected to settle within window (PrefetchWindow), at least 1 and at
// most BatchSize. Before the first message is settled it asks for 1. A
// negative window asks for BatchSize always. The time a
// message takes is from its hand-over to its Ack or Nack, averaged over the
// last few messages. Drains and claims take up to BatchSize: they recover
// entries that have waited already, and a drain reads only this consumer's
// own.
type prefetch struct {
	max     int64
	window  time.Duration
	avg     time.Duration // moving average of the settle time; 0 before the first
	handled bool          // avg holds a measure
	since   time.Time     // hand-over of the message in the handler's hands
}

func newPrefetch(batchSize int64, window time.Duration) prefetch {
	return prefetch{max: batchSize, window: window}
}

// count returns how many entries the next read asks for.
func (p *prefetch) count() int64 {
	switch {
	case p.window < 0:
		return p.max
	case !p.handled:
		return 1
	case p.avg <= 0:
		return p.max
	}
	return min(max(int64(p.window/p.avg), 1), p.max)
}

// handedOver records that the handler took a message at now.
func (p *prefetch) handedOver(now time.Time) { p.since = now }

// settled records that the handler Acked or Nacked the message at now.
func (p *prefetch) settled(now time.Time) {
	d := now.Sub(p.since)
	if !p.handled {
		p.avg, p.handled = d, true
		return
	}
	p.avg += (d - p.avg) / 4
}
