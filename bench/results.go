package main

import (
	"slices"
	"time"
)

// A sample is one run of one side of one scenario at one payload size.
type sample struct {
	n       int           // messages
	elapsed time.Duration // first call to the last message published or succeeded

	duplicates int64         // messages that succeeded more than once
	pending    int64         // entries still pending in the group after the run
	nacks      int64         // Nacks sent (nack scenario)
	deliveries int64         // deliveries, redeliveries included (consume scenarios)
	tail       time.Duration // from the last first delivery to the last success

	// from a Nack to the next delivery of the message: mean and longest
	redeliveryMean, redeliveryMax time.Duration

	peakRSS int64 // peak resident memory of the consuming process (large payloads)

	// heap objects and bytes the whole process allocated in the timed part
	// of a consume run
	allocs, allocBytes uint64
}

// rate is messages per second.
func (s sample) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.n) / s.elapsed.Seconds()
}

// key names the runs whose samples are pooled.
type key struct {
	scenario string
	side     string
	size     int
	delay    time.Duration // added to the server's replies (0: loopback)
}

// results holds every sample of the benchmark, in the order they were taken.
type results struct {
	samples map[key][]sample
}

func newResults() *results { return &results{samples: map[key][]sample{}} }

func (r *results) add(k key, s sample) { r.samples[k] = append(r.samples[k], s) }

// medianRate is the median rate of the samples under k, and whether there
// are any.
func (r *results) medianRate(k key) (float64, bool) {
	ss := r.samples[k]
	if len(ss) == 0 {
		return 0, false
	}
	rates := make([]float64, len(ss))
	for i, s := range ss {
		rates[i] = s.rate()
	}
	return median(rates), true
}

// rateRange is the lowest and the highest rate of the samples under k.
func (r *results) rateRange(k key) (lo, hi float64) {
	for i, s := range r.samples[k] {
		if i == 0 {
			lo, hi = s.rate(), s.rate()
		}
		lo, hi = min(lo, s.rate()), max(hi, s.rate())
	}
	return lo, hi
}

// allocsPerMessage is the median, over the samples under k, of the heap
// objects and bytes allocated per message.
func (r *results) allocsPerMessage(k key) (objects, bytes float64) {
	ss := r.samples[k]
	os, bs := make([]float64, len(ss)), make([]float64, len(ss))
	for i, s := range ss {
		if s.n > 0 {
			os[i], bs[i] = float64(s.allocs)/float64(s.n), float64(s.allocBytes)/float64(s.n)
		}
	}
	return median(os), median(bs)
}

// medianDuration is the median of one duration of the samples under k.
func (r *results) medianDuration(k key, of func(sample) time.Duration) time.Duration {
	ss := r.samples[k]
	ds := make([]float64, len(ss))
	for i, s := range ss {
		ds[i] = float64(of(s))
	}
	return time.Duration(median(ds))
}

// totals sums the bookkeeping counters of the samples under k.
func (r *results) totals(k key) (duplicates, pending, nacks, deliveries, messages int64) {
	for _, s := range r.samples[k] {
		duplicates += s.duplicates
		pending += s.pending
		nacks += s.nacks
		deliveries += s.deliveries
		messages += int64(s.n)
	}
	return
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none. xs is not changed.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// ratio returns a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// widestSpread returns the key whose runs differ most (by the ratio of the
// highest rate to the lowest), with those two rates; ok is false when no
// key has two runs.
func (r *results) widestSpread() (widest key, lo, hi float64, ok bool) {
	best := 0.0
	for k, ss := range r.samples {
		if len(ss) < 2 {
			continue
		}
		kLo, kHi := ss[0].rate(), ss[0].rate()
		for _, s := range ss[1:] {
			kLo, kHi = min(kLo, s.rate()), max(kHi, s.rate())
		}
		if spread := ratio(kHi, kLo); spread > best || (spread == best && ok && keyLess(k, widest)) {
			best, widest, lo, hi, ok = spread, k, kLo, kHi, true
		}
	}
	return widest, lo, hi, ok
}

// keyLess orders keys, so that ties are broken the same way every time.
func keyLess(a, b key) bool {
	if a.scenario != b.scenario {
		return a.scenario < b.scenario
	}
	if a.side != b.side {
		return a.side < b.side
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.delay < b.delay
}
