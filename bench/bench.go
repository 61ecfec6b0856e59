package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// bench is one run of the benchmark.
type bench struct {
	cfg      config
	srv      *server
	admin    *redis.Client // for checks and cleanup, on loopback; no side uses it
	res      *results
	memory   []memorySample
	latency  []latencySample
	topics   []topicsSample
	scale    []scaleSample
	rtts     map[time.Duration]time.Duration // round trip measured at each delay
	dist     distance                        // where the sides' clients connect
	runs     int
	progress io.Writer
}

// runAll runs the memory scenario at every distance, then, at each distance
// in turn, every picked scenario for every side, payload size and
// repetition. The memory scenario goes first, while the heap holds nothing
// of other runs (the runtime keeps the descriptors of every goroutine that
// ever ran, and gochannel starts one per message).
func (b *bench) runAll(ctx context.Context, picked []scenario) error {
	b.rtts = map[time.Duration]time.Duration{}
	if len(b.cfg.memoryNs) > 0 {
		err := b.atDistances(ctx, func(d distance) error {
			for _, n := range b.cfg.memoryNs {
				m, err := b.runMemory(ctx, n)
				if err != nil {
					return fmt.Errorf("memory, %d entries, %s: %w", n, d.describe(), err)
				}
				m.delay, m.rtt = d.delay, d.rtt
				b.memory = append(b.memory, m)
				fmt.Fprintf(b.progress, "memory %d entries: live heap +%s (peak heap +%s), %s msg/s\n",
					n, formatBytes(m.liveGrowth()), formatBytes(m.heapGrowth()), formatRate(m.rate()))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return b.atDistances(ctx, func(d distance) error {
		b.rtts[d.delay] = d.rtt
		for rep := range b.cfg.reps {
			if err := b.runRepetition(ctx, picked, rep); err != nil {
				return fmt.Errorf("%s: %w", d.describe(), err)
			}
		}
		return nil
	})
}

// runRepetition runs every picked scenario once at the current distance.
func (b *bench) runRepetition(ctx context.Context, picked []scenario, rep int) error {
	for _, size := range b.sizesHere() {
		for _, scn := range picked {
			if scn.kind != kindThroughput {
				continue
			}
			n := b.cfg.consumeN
			if scn.publish {
				n = b.cfg.publishN
			}
			if b.dist.delay > 0 && b.cfg.distanceMessages > 0 {
				n = min(n, b.cfg.distanceMessages)
			}
			c, err := newCorpus(uint64(rep)<<32|uint64(size), n, size)
			if err != nil {
				return err
			}
			for _, name := range rotate(scn.sides, rep) {
				sd := sides[name]
				var s sample
				if scn.publish {
					s, err = b.runPublish(ctx, scn, sd, c)
				} else {
					s, err = b.runConsume(ctx, scn, sd, c)
				}
				if err != nil {
					return fmt.Errorf("%s, %s, %d bytes, repetition %d: %w", scn.id, name, size, rep+1, err)
				}
				b.res.add(key{scn.id, name, size, b.dist.delay}, s)
				b.printSample(rep, scn, name, size, s)
			}
		}
	}
	for _, scn := range picked {
		var err error
		switch scn.kind {
		case kindLatency:
			err = b.runLatencyScenario(ctx, scn, rep)
		case kindLarge:
			err = b.runLargeScenario(ctx, scn, rep)
		case kindTopics:
			err = b.runTopicsScenario(ctx, scn, rep)
		case kindScale:
			err = b.runScaleScenario(ctx, scn, rep)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// sizesHere returns the payload sizes of the publish and consume scenarios
// at the current distance.
func (b *bench) sizesHere() []int {
	if b.dist.delay > 0 && len(b.cfg.distanceSizes) > 0 {
		return b.cfg.distanceSizes
	}
	return b.cfg.sizes
}

func (b *bench) printSample(rep int, scn scenario, name string, size int, s sample) {
	extra := ""
	if s.peakRSS > 0 {
		extra = ", peak RSS " + formatBytes(s.peakRSS)
	}
	fmt.Fprintf(b.progress, "rep %d/%d %4d B  %-18s %-22s %9s msg/s  (%d in %s%s)%s\n",
		rep+1, b.cfg.reps, size, scn.id, name, formatRate(s.rate()), s.n,
		s.elapsed.Round(time.Millisecond), extra, sampleNotes(s))
}

// sampleNotes names what a run had beyond plain success, for the progress
// line.
func sampleNotes(s sample) string {
	var notes []string
	if s.nacks > 0 {
		notes = append(notes, fmt.Sprintf("%d nacks, tail %s, redelivery wait %s mean, %s longest",
			s.nacks, formatDuration(s.tail), formatDuration(s.redeliveryMean), formatDuration(s.redeliveryMax)))
	}
	if s.duplicates > 0 {
		notes = append(notes, fmt.Sprintf("%d DUPLICATES", s.duplicates))
	}
	if s.pending > 0 {
		notes = append(notes, fmt.Sprintf("%d LEFT PENDING", s.pending))
	}
	if len(notes) == 0 {
		return ""
	}
	return " " + strings.Join(notes, ", ")
}

// topic returns a new topic name for one run.
func (b *bench) topic(scn scenario, sd side, c corpus) string {
	b.runs++
	return fmt.Sprintf("bench-%s-%s-%d-%d", scn.id, sd.name, c.size, b.runs)
}

// cleanup deletes a run's keys and, where allowed, empties the server.
func (b *bench) cleanup(ctx context.Context, topic string) {
	if ctx.Err() != nil {
		return
	}
	err := b.admin.Del(ctx, topic, topic+".invalid").Err()
	if err == nil {
		err = b.srv.reset(ctx, b.admin)
	}
	if err != nil {
		fmt.Fprintf(b.progress, "warning: cleaning up after %s: %v\n", topic, err)
	}
}
