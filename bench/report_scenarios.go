package main

import (
	"fmt"
	"strings"
	"time"
)

// The report's tables for the latency, consume-large and many-topics
// scenarios.

// latencyKey names the latency runs whose figures are pooled.
type latencyKey struct {
	delay time.Duration
	rate  int
	side  string
}

func (r report) writeLatency(w *strings.Builder) {
	if len(r.samples.latency) == 0 {
		return
	}
	runs := map[latencyKey][]latencySample{}
	for _, l := range r.samples.latency {
		k := latencyKey{l.delay, l.rate, l.side}
		runs[k] = append(runs[k], l)
	}
	fmt.Fprintf(w, "### End-to-end latency\n\n"+
		"One handler on a router, subscribed before anything is published; %d\n"+
		"goroutines publish %d-byte messages, one per call, on a fixed schedule at\n"+
		"the given rate for %s. Each message carries the time its `Publish` call\n"+
		"began (metadata `%s`, Unix nanoseconds); the handler books the time\n"+
		"from then to its own start. \"Reached\" is the publish rate the schedule\n"+
		"kept (below the asked rate when publishing fell behind). Figures are\n"+
		"medians over %s.\n\n",
		publishWorkers, latencySize, r.cfg.latencyDuration, publishedAtKey, plural(r.cfg.reps, "run"))
	w.WriteString("| round trip | rate | side | reached msg/s | p50 | p99 | max | p99 vs watermill-redisstream |\n")
	w.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for _, delay := range r.cfg.delays {
		for _, rate := range r.cfg.latencyRates {
			incP99 := medianLatency(runs[latencyKey{delay, rate, sideIncumbent}], func(l latencySample) time.Duration { return l.stats.p99 })
			for _, name := range chartSides {
				ls := runs[latencyKey{delay, rate, name}]
				if len(ls) == 0 {
					continue
				}
				p99 := medianLatency(ls, func(l latencySample) time.Duration { return l.stats.p99 })
				vsInc := "–"
				if name != sideIncumbent && incP99 > 0 {
					vsInc = formatLatencyRatio(ratio(float64(p99), float64(incP99)))
				}
				achieved := make([]float64, len(ls))
				for i, l := range ls {
					achieved[i] = l.achieved
				}
				fmt.Fprintf(w, "| %s | %s/s | %s | %s | %s | %s | %s | %s |\n",
					r.rttCell(delay), groupThousands(int64(rate)), name, formatRate(median(achieved)),
					formatDuration(medianLatency(ls, func(l latencySample) time.Duration { return l.stats.p50 })),
					formatDuration(p99),
					formatDuration(medianLatency(ls, func(l latencySample) time.Duration { return l.stats.max })),
					vsInc)
			}
		}
	}
	w.WriteString("\n")
}

// formatLatencyRatio writes a ratio of latencies: "1.40×", "0.05×", or
// "<0.01×" for a small one.
func formatLatencyRatio(r float64) string {
	if r < 0.01 {
		return "<0.01×"
	}
	return fmt.Sprintf("%.2f×", r)
}

// medianLatency is the median of one figure over runs; 0 for none.
func medianLatency(runs []latencySample, of func(latencySample) time.Duration) time.Duration {
	xs := make([]float64, len(runs))
	for i, l := range runs {
		xs[i] = float64(of(l))
	}
	return time.Duration(median(xs))
}

func (r report) writeLarge(w *strings.Builder) {
	var large *scenario
	for i := range r.scenarios {
		if r.scenarios[i].kind == kindLarge {
			large = &r.scenarios[i]
		}
	}
	if large == nil {
		return
	}
	fmt.Fprintf(w, "### Large payloads\n\n"+
		"Consume through a router (a handler that returns nil) in a child process\n"+
		"of its own per side, so that its peak resident memory (the kernel's\n"+
		"maximum RSS of that process, Go runtime included) is the consumer's\n"+
		"alone. Each run pre-fills %d MiB of payload (at least 10 messages); the\n"+
		"clock runs from `Router.Run` to the last message handled. Figures are\n"+
		"medians over %s.\n\n", r.cfg.largeMiB, plural(r.cfg.reps, "run"))
	w.WriteString("| payload | round trip | side | messages | msg/s | MiB/s | peak RSS |\n")
	w.WriteString("|---:|---:|---|---:|---:|---:|---:|\n")
	for _, size := range r.cfg.largeSizes {
		for _, delay := range r.cfg.delays {
			for _, name := range large.sides {
				k := key{large.id, name, size, delay}
				rate, ok := r.res.medianRate(k)
				if !ok {
					continue
				}
				rss := r.res.medianDuration(k, func(s sample) time.Duration { return time.Duration(s.peakRSS) })
				rssCell := "–"
				if rss > 0 {
					rssCell = formatBytes(int64(rss))
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.1f | %s |\n",
					formatBytes(int64(size)), r.rttCell(delay), name, groupThousands(int64(r.res.samples[k][0].n)),
					formatRate(rate), rate*float64(size)/(1<<20), rssCell)
			}
		}
	}
	w.WriteString("\n")
}

func (r report) writeTopics(w *strings.Builder) {
	if len(r.samples.topics) == 0 {
		return
	}
	fmt.Fprintf(w, "### Many topics\n\n"+
		"One Subscriber on one go-redis client with its default options, and a\n"+
		"router with one handler per topic. The start is the time from\n"+
		"`Router.Run` until every handler has subscribed, bounded by %s. Then\n"+
		"one %d-byte message per topic per %s, spread evenly over the period,\n"+
		"for %s; latency is from each `Publish` call to its handler's start.\n"+
		"Connections are the most the subscriber's client held at once (sampled\n"+
		"every 10 ms), out of its pool; pool timeouts are waits for a connection\n"+
		"that gave up. Server connections are the most the server counted at once\n"+
		"above those open before the subscriber started (sampled every 10 ms with\n"+
		"INFO clients): they include connections of clients the subscriber makes\n"+
		"of its own, which its client's pool does not show. Every run is listed.\n\n",
		r.cfg.topicStart, latencySize, r.cfg.topicPeriod, plural(r.cfg.topicRounds, "period"))
	w.WriteString("| topics | round trip | side | start | p50 | p99 | max | connections (pool) | pool timeouts | server connections |\n")
	w.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range r.samples.topics {
		start, p50, p99, most := formatDuration(t.startTime), "–", "–", "–"
		if t.allStarted() {
			p50, p99, most = formatDuration(t.stats.p50), formatDuration(t.stats.p99), formatDuration(t.stats.max)
		} else {
			start = t.startFailure()
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %d (%d) | %d | %d |\n",
			groupThousands(int64(t.topics)), r.rttCell(t.delay), t.side, start, p50, p99, most,
			t.peakConns, t.poolSize, t.poolTimeouts, t.serverConns)
	}
	w.WriteString("\n")
}
