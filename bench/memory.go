package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// memorySize is the payload size of the memory scenario.
const memorySize = 64

// memorySample is one run of the memory scenario: a valkeystream subscriber
// consuming a pre-filled backlog of n entries from the channel, with the
// process' heap sampled meanwhile.
type memorySample struct {
	n          int
	elapsed    time.Duration
	delay, rtt time.Duration // the distance it ran at

	baseLive uint64 // live heap after the pre-fill and a forced GC
	peakLive uint64 // highest live heap a GC reported during the run
	baseHeap uint64 // heap objects (live and not yet swept) at the start
	peakHeap uint64 // highest heap objects sampled during the run
	allocs   uint64 // bytes allocated during the run
	gcs      uint64 // GC cycles during the run

	duplicates, pending int64
}

func (m memorySample) rate() float64 { return sample{n: m.n, elapsed: m.elapsed}.rate() }

// liveGrowth is how much the live heap grew over the run.
func (m memorySample) liveGrowth() int64 { return int64(m.peakLive) - int64(m.baseLive) }

// heapGrowth is how much the heap (live and garbage) grew over the run.
func (m memorySample) heapGrowth() int64 { return int64(m.peakHeap) - int64(m.baseHeap) }

// heapMetrics are the runtime/metrics the memory scenario samples.
var heapMetrics = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/allocs:bytes",
	"/gc/cycles/total:gc-cycles",
}

func readHeap() (live, heap, allocs, gcs uint64) {
	s := make([]metrics.Sample, len(heapMetrics))
	for i, name := range heapMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64(), s[3].Value.Uint64()
}

// heapSampler records the highest live heap and heap in use until stopped.
type heapSampler struct {
	stopCh   chan struct{}
	wg       sync.WaitGroup
	peakLive uint64
	peakHeap uint64
}

func startHeapSampler(every time.Duration) *heapSampler {
	h := &heapSampler{stopCh: make(chan struct{})}
	h.peakLive, h.peakHeap, _, _ = readHeap()
	h.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-h.stopCh:
				return
			case <-tick.C:
				live, heap, _, _ := readHeap()
				h.peakLive, h.peakHeap = max(h.peakLive, live), max(h.peakHeap, heap)
			}
		}
	})
	return h
}

// stop ends the sampling, takes a last sample and returns the peaks.
func (h *heapSampler) stop() (peakLive, peakHeap uint64) {
	close(h.stopCh)
	h.wg.Wait()
	live, heap, _, _ := readHeap()
	return max(h.peakLive, live), max(h.peakHeap, heap)
}

// runMemory consumes a backlog of n entries with valkeystream and samples
// the heap of this process meanwhile.
func (b *bench) runMemory(ctx context.Context, n int) (memorySample, error) {
	c, err := newCorpus(0x6d656d, n, memorySize)
	if err != nil {
		return memorySample{}, err
	}
	sd := sides[sideValkeystream]
	sc := newScope(b.dist.addr)
	defer sc.close()
	scn := scenario{id: memoryScenario}
	topic := b.topic(scn, sd, c)
	defer b.cleanup(ctx, topic)

	sub, err := sd.prefill(ctx, sc, topic, c)
	if err != nil {
		return memorySample{}, err
	}
	tr := newTracker(c, false)
	if err := sc.warm(ctx, 2); err != nil {
		return memorySample{}, err
	}
	runtime.GC()
	runtime.GC()
	baseLive, baseHeap, baseAllocs, baseGCs := readHeap()
	sampler := startHeapSampler(5 * time.Millisecond)
	var pending int64
	_, err = b.timeConsume(ctx, tr, func(ctx context.Context) error {
		return consumeChannel(ctx, sub, topic, tr, false)
	}, func() error {
		var err error
		pending, err = b.pendingAfter(ctx, topic)
		return err
	})
	peakLive, peakHeap := sampler.stop()
	_, _, allocs, gcs := readHeap()
	if err != nil {
		return memorySample{}, fmt.Errorf("%s on %s: %w", sd.name, topic, err)
	}
	m := memorySample{
		n: n, elapsed: tr.elapsed(),
		baseLive: baseLive, peakLive: peakLive,
		baseHeap: baseHeap, peakHeap: peakHeap,
		allocs: allocs - baseAllocs, gcs: gcs - baseGCs,
		duplicates: tr.duplicates.Load(),
		pending:    pending,
	}
	if err := sc.close(); err != nil {
		return memorySample{}, err
	}
	return m, nil
}
