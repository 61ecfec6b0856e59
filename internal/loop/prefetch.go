package loop

import "time"

// prefetch sizes a group loop's reads by how fast its handler settles
// messages, so that a slow handler does not hoard entries that idle peers
// could handle, and a crash strands little: a read asks for what the handler
// is expected to settle within window (PrefetchWindow), at least 1 and at
// most BatchSize. Before the first message is settled it asks for 1. A
// negative window asks for BatchSize always. The time a
// message takes is from its hand-over to its Ack or Nack, averaged over the
// last few messages.
//
// Every read, drains and claims too, is also bounded in bytes
// (ReadAheadBytes): it asks for at most as many entries as fit in the bound
// at the average size of the entries read so far, at least 1, and for 1
// before any entry has been seen. Drains and claims are not sized by the
// handler's speed: they recover entries that have waited already, and a
// drain reads only this consumer's own; but they hold payloads like any
// read, so the byte bound applies to them as well.
type prefetch struct {
	max      int64
	window   time.Duration
	avg      time.Duration // moving average of the settle time; 0 before the first
	handled  bool          // avg holds a measure
	since    time.Time     // hand-over of the message in the handler's hands
	maxBytes int64         // bound of one read in bytes; negative: none
	size     int64         // moving average of an entry's size; 0 before the first
}

func newPrefetch(batchSize int64, window time.Duration, maxBytes int64) prefetch {
	return prefetch{max: batchSize, window: window, maxBytes: maxBytes}
}

// count returns how many entries the next read of new entries asks for.
func (p *prefetch) count() int64 {
	var n int64
	switch {
	case p.window < 0:
		n = p.max
	case !p.handled:
		n = 1
	case p.avg <= 0:
		n = p.max
	default:
		n = min(max(int64(p.window/p.avg), 1), p.max)
	}
	return p.fit(n)
}

// settledWithin returns how many entries the handler settles within d at its
// measured pace: 0 before the first is settled, BatchSize when it settles
// faster than the clock tells.
func (p *prefetch) settledWithin(d time.Duration) int64 {
	switch {
	case !p.handled:
		return 0
	case p.avg <= 0:
		return p.max
	}
	return int64(d / p.avg)
}

// room returns how many more entries of the average size fit in
// ReadAheadBytes beside held ones (no bound: as many as BatchSize).
func (p *prefetch) room(held int64) int64 {
	if p.maxBytes < 0 || p.size <= 0 {
		return p.max
	}
	return p.maxBytes/p.size - held
}

// batch returns how many entries the next drain or claim asks for.
func (p *prefetch) batch() int64 { return p.fit(p.max) }

// fit caps n so that n entries of the average size stay within maxBytes.
func (p *prefetch) fit(n int64) int64 {
	switch {
	case p.maxBytes < 0:
		return n
	case p.size <= 0:
		return 1
	}
	return min(max(p.maxBytes/p.size, 1), n)
}

// read records the fields of an entry the loop queued, to estimate the size
// of the next ones: the summed lengths of field names and values, as the
// client holds them.
func (p *prefetch) read(fields map[string]any) {
	if p.maxBytes < 0 {
		return
	}
	var n int64
	for k, v := range fields {
		n += int64(len(k))
		if s, ok := v.(string); ok {
			n += int64(len(s))
		}
	}
	n = max(n, 1)
	if p.size == 0 {
		p.size = n
		return
	}
	p.size += (n - p.size) / 8
	p.size = max(p.size, 1)
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
