package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// report turns the results of one run into Markdown and a chart.
type report struct {
	cfg       config
	machine   machine
	server    string
	scenarios []scenario
	res       *results
	samples   samples
	rtts      map[time.Duration]time.Duration // round trip measured at each delay
	wall      time.Duration
	leaks     string
	date      time.Time
}

// samples are what the scenarios other than throughput measured.
type samples struct {
	memory  []memorySample
	latency []latencySample
	topics  []topicsSample
	scale   []scaleSample
}

// write writes the Markdown to cfg.out (standard output when empty) and the
// chart to cfg.chart (none when empty).
func (r report) write() error {
	if r.date.IsZero() {
		r.date = time.Now()
	}
	chartRef := ""
	if r.cfg.chart != "" {
		svg := r.chartSVG()
		if err := os.WriteFile(r.cfg.chart, []byte(svg), 0o644); err != nil {
			return fmt.Errorf("writing the chart: %w", err)
		}
		chartRef = r.cfg.chart
		if r.cfg.out != "" {
			if rel, err := filepath.Rel(filepath.Dir(r.cfg.out), r.cfg.chart); err == nil {
				chartRef = filepath.ToSlash(rel)
			}
		}
	}
	md := r.markdown(chartRef)
	if r.cfg.out == "" {
		_, err := io.WriteString(os.Stdout, md)
		return err
	}
	if err := os.WriteFile(r.cfg.out, []byte(md), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// markdown is the whole report; chartRef is the chart's path relative to
// the report, or "" for none.
func (r report) markdown(chartRef string) string {
	var w strings.Builder
	w.WriteString("# Benchmarks: valkeystream and watermill-redisstream\n\n")
	w.WriteString(howToRun)
	r.writeSetup(&w)
	if chartRef != "" {
		fmt.Fprintf(&w, "![Messages per second by scenario, %d-byte payloads](%s)\n\n", r.chartSize(), chartRef)
	}
	r.writeThroughput(&w)
	w.WriteString(bounds)
	r.writeNack(&w)
	r.writeLatency(&w)
	r.writeLarge(&w)
	r.writeTopics(&w)
	r.writeMetricsCost(&w)
	r.writeIdempotentCost(&w)
	r.writeExactlyOnceCost(&w)
	r.writePartitionCost(&w)
	r.writeScale(&w)
	r.writeMemory(&w)
	r.writeChecks(&w)
	w.WriteString(method)
	r.writeSamples(&w)
	return w.String()
}

func (r report) writeSetup(w *strings.Builder) {
	m := r.machine
	w.WriteString("## Results\n\n")
	fmt.Fprintf(w, "Run on %s with `go run -C bench . %s`; wall time %s.\n\n",
		r.date.UTC().Format("2006-01-02 15:04 MST"), strings.Join(quoteArgs(r.cfg.args), " "), r.wall.Round(time.Second))
	w.WriteString("| | |\n|---|---|\n")
	fmt.Fprintf(w, "| CPU | %s |\n", m.cpu)
	fmt.Fprintf(w, "| cores | %d (GOMAXPROCS %d) |\n", m.cores, m.gomaxprocs)
	fmt.Fprintf(w, "| OS | %s |\n", m.os)
	fmt.Fprintf(w, "| Go | %s |\n", m.goVersion)
	fmt.Fprintf(w, "| server | %s |\n", r.server)
	if m.loadStart != "" {
		fmt.Fprintf(w, "| load average (1, 5, 15 min) | %s at the start, %s at the end |\n", m.loadStart, m.loadEnd)
	}
	fmt.Fprintf(w, "| messages | %s per publish run, %s per consume run; payloads of %s bytes |\n",
		groupThousands(int64(r.cfg.publishN)), groupThousands(int64(r.cfg.consumeN)), joinInts(r.cfg.sizes, ", "))
	if len(r.cfg.delays) > 1 && (r.cfg.distanceMessages > 0 || len(r.cfg.distanceSizes) > 0) {
		sizes, most := r.cfg.sizes, "as many messages"
		if len(r.cfg.distanceSizes) > 0 {
			sizes = r.cfg.distanceSizes
		}
		if r.cfg.distanceMessages > 0 {
			most = "at most " + groupThousands(int64(r.cfg.distanceMessages)) + " messages per run"
		}
		fmt.Fprintf(w, "| at a distance | %s; payloads of %s bytes |\n", most, joinInts(sizes, ", "))
	}
	fmt.Fprintf(w, "| repetitions | %d; every figure is the median |\n", r.cfg.reps)
	fmt.Fprintf(w, "| network distance | %s |\n\n", r.describeDistances())
	w.WriteString("The server and both adapters share the machine's cores, so every figure\n" +
		"includes the server's own work. Compare sides within one run; absolute\n" +
		"figures move with the machine and its load.\n\n")
}

// throughputRow is one line of the throughput table.
type throughputRow struct {
	scenario, size, rtt, vs, inc, ratio, ref, vsOfRef, incOfRef string
}

func (r report) writeThroughput(w *strings.Builder) {
	var rows []throughputRow
	for _, scn := range r.scenarios {
		if scn.nack || scn.kind != kindThroughput || slices.Contains(scn.sides, sideMetrics) || scn.isIdempotentScenario() || scn.isPartitionCost() {
			continue
		}
		for _, size := range r.cfg.allSizes() {
			for _, delay := range r.cfg.delays {
				vs, okVS := r.res.medianRate(key{scn.id, sideValkeystream, size, delay})
				inc, okInc := r.res.medianRate(key{scn.id, sideIncumbent, size, delay})
				if !okVS && !okInc {
					continue
				}
				row := throughputRow{
					scenario: scn.title, size: fmt.Sprintf("%d B", size), rtt: r.rttCell(delay),
					vs: rateCell(vs, okVS), inc: rateCell(inc, okInc), ratio: formatRatio(ratio(vs, inc)),
					ref: "–", vsOfRef: "–", incOfRef: "–",
				}
				if name := scn.reference(); name != "" {
					if ref, ok := r.res.medianRate(key{scn.id, name, size, delay}); ok {
						row.ref = name + " " + formatRate(ref)
						row.vsOfRef = formatPercent(ratio(vs, ref))
						row.incOfRef = formatPercent(ratio(inc, ref))
					}
				}
				rows = append(rows, row)
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Throughput\n\nMessages per second, median of %s. The ratio is valkeystream's rate\n"+
		"over watermill-redisstream's. The reference is the same work without an\n"+
		"adapter: go-redis alone sending each call's messages as the call hands\n"+
		"them over (one `XADD` for one message, the `XADD`s of a larger call\n"+
		"pipelined), or reading with `XREADGROUP COUNT 100` and one `XACK` per\n"+
		"batch; and, for the router, Watermill's in-memory gochannel through the\n"+
		"same router. A reference is not a bound: an adapter that merges the\n"+
		"round trips of concurrent calls can pass it. The round trip is the\n"+
		"median PING time from the clients' side at that distance.\n\n", plural(r.cfg.reps, "run"))
	w.WriteString("| scenario | payload | round trip | valkeystream | watermill-redisstream | ratio | reference | valkeystream % of ref. | redisstream % of ref. |\n")
	w.WriteString("|---|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | **%s** | %s | %s | %s |\n",
			row.scenario, row.size, row.rtt, row.vs, row.inc, row.ratio, row.ref, row.vsOfRef, row.incOfRef)
	}
	w.WriteString("\n")
	if k, lo, hi, ok := r.res.widestSpread(); ok && r.cfg.reps > 1 {
		fmt.Fprintf(w, "The widest spread between the runs of one measurement: %s, %s, %d B,\n"+
			"round trip %s, from %s to %s msg/s (every run is listed at the end).\n\n",
			k.scenario, k.side, k.size, r.rttCell(k.delay), formatRate(lo), formatRate(hi))
	}
}

func rateCell(r float64, ok bool) string {
	if !ok {
		return "–"
	}
	return formatRate(r)
}

func (r report) writeNack(w *strings.Builder) {
	var nack *scenario
	for i := range r.scenarios {
		if r.scenarios[i].nack {
			nack = &r.scenarios[i]
		}
	}
	if nack == nil {
		return
	}
	fmt.Fprintf(w, "### Nack\n\nThe first delivery of one message in %d (chosen by a hash of its UUID, the\n"+
		"same messages for both sides) is Nacked; a run ends when every message\n"+
		"has been Acked once. The tail is the time from the last first delivery of\n"+
		"any message to the last success: how far redeliveries trail behind (0\n"+
		"when the last message to arrive was not Nacked). The\n"+
		"redelivery wait is the time from a Nack to the next delivery of that\n"+
		"message (mean within a run, and the longest). \"vs no Nack\" divides the\n"+
		"rate by the same side's rate in the plain channel scenario. Durations are\n"+
		"medians over the runs.\n\n", nackOneIn)
	w.WriteString("| payload | round trip | side | msg/s | vs no Nack | Nacks per run | deliveries per message | tail | redelivery wait, mean | longest |\n")
	w.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, size := range r.cfg.allSizes() {
		for _, delay := range r.cfg.delays {
			for _, name := range nack.sides {
				k := key{nack.id, name, size, delay}
				rate, ok := r.res.medianRate(k)
				if !ok {
					continue
				}
				plain, _ := r.res.medianRate(key{"consume-channel", name, size, delay})
				_, _, nacks, deliveries, messages := r.res.totals(k)
				runs := int64(len(r.res.samples[k]))
				fmt.Fprintf(w, "| %d B | %s | %s | %s | %s | %s | %.3f | %s | %s | %s |\n",
					size, r.rttCell(delay), name, formatRate(rate), formatPercent(ratio(rate, plain)),
					groupThousands(nacks/runs), float64(deliveries)/float64(messages),
					formatDuration(r.res.medianDuration(k, func(s sample) time.Duration { return s.tail })),
					formatDuration(r.res.medianDuration(k, func(s sample) time.Duration { return s.redeliveryMean })),
					formatDuration(r.res.medianDuration(k, func(s sample) time.Duration { return s.redeliveryMax })))
			}
		}
	}
	w.WriteString("\n")
}

func (r report) writeMemory(w *strings.Builder) {
	if len(r.samples.memory) == 0 {
		return
	}
	fmt.Fprintf(w, "### Memory\n\nA valkeystream subscriber consumes a pre-filled backlog of %d-byte\n"+
		"messages from the channel, one run per backlog, while this process' heap\n"+
		"is sampled every 5 ms (`runtime/metrics`). The starting point is the heap\n"+
		"after the pre-fill and a forced collection; it holds the benchmark's own\n"+
		"books (8 bytes a message), which is why it grows with the backlog. Live\n"+
		"heap growth is the highest live heap a collection found during the run,\n"+
		"minus the start: what the subscriber holds. Heap objects also count\n"+
		"garbage not yet collected; the collector lets that grow in proportion to\n"+
		"the live heap, books included.\n\n", memorySize)
	w.WriteString("| backlog | round trip | msg/s | live heap at start | live heap growth (peak) | heap objects growth (peak) | allocated per message | GC cycles |\n")
	w.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.samples.memory {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %d |\n",
			groupThousands(int64(m.n)), formatDuration(m.rtt), formatRate(m.rate()), formatBytes(int64(m.baseLive)),
			formatBytes(m.liveGrowth()), formatBytes(m.heapGrowth()),
			formatBytes(int64(m.allocs)/int64(m.n)), m.gcs)
	}
	if len(r.samples.memory) > 1 && r.samples.memory[0].delay == r.samples.memory[len(r.samples.memory)-1].delay {
		first, last := r.samples.memory[0], r.samples.memory[len(r.samples.memory)-1]
		fmt.Fprintf(w, "\nLive heap growth: %s with a backlog of %s, %s with %s (%.0f× the backlog).\n",
			formatBytes(first.liveGrowth()), groupThousands(int64(first.n)),
			formatBytes(last.liveGrowth()), groupThousands(int64(last.n)), float64(last.n)/float64(first.n))
	}
	w.WriteString("\n")
}

func (r report) writeChecks(w *strings.Builder) {
	w.WriteString("### Checks\n\n")
	w.WriteString("Every consume run counted each message by the sequence number in its\n" +
		"payload and ran until every one had succeeded; a missing message, a\n" +
		"payload that was never published, or a stall fails the whole benchmark.\n" +
		"Every publish run checked that the stream held every message afterwards.\n" +
		"After each consume run the group's pending list was read (waiting up to\n" +
		"3 s for the last Acks).\n\n")
	var lines []string
	for _, scn := range r.scenarios {
		if scn.publish {
			continue
		}
		for _, name := range scn.sides {
			for _, size := range scn.sizes(r.cfg) {
				for _, delay := range r.cfg.delays {
					dup, pending, _, _, _ := r.res.totals(key{scn.id, name, size, delay})
					if dup > 0 || pending > 0 {
						lines = append(lines, fmt.Sprintf("| %s, round trip %s | %s | %d B | %d | %d |", scn.id, r.rttCell(delay), name, size, dup, pending))
					}
				}
			}
		}
	}
	for _, l := range r.samples.latency {
		if l.dups > 0 {
			lines = append(lines, fmt.Sprintf("| latency %d msg/s, round trip %s | %s | %d B | %d | – |", l.rate, r.rttCell(l.delay), l.side, latencySize, l.dups))
		}
	}
	for _, t := range r.samples.topics {
		if t.dups > 0 {
			lines = append(lines, fmt.Sprintf("| many-topics %d, round trip %s | %s | %d B | %d | – |", t.topics, r.rttCell(t.delay), t.side, latencySize, t.dups))
		}
	}
	for _, m := range r.samples.memory {
		if m.duplicates > 0 || m.pending > 0 {
			lines = append(lines, fmt.Sprintf("| memory %d | %s | %d B | %d | %d |", m.n, sideValkeystream, memorySize, m.duplicates, m.pending))
		}
	}
	if len(lines) == 0 {
		w.WriteString("Result: no duplicates, and nothing left pending, in any run.\n\n")
	} else {
		w.WriteString("Runs with duplicates (messages that succeeded more than once) or entries\nleft pending, summed over the repetitions:\n\n")
		w.WriteString("| scenario | side | payload | duplicates | left pending |\n|---|---|---:|---:|---:|\n")
		w.WriteString(strings.Join(lines, "\n") + "\n\n")
	}
	if r.leaks != "" {
		w.WriteString("Goroutines were still running after the last run:\n\n```\n" + r.leaks + "\n```\n\n")
	}
}

func (r report) writeSamples(w *strings.Builder) {
	w.WriteString("<details><summary>Every run (messages/s)</summary>\n\n")
	w.WriteString("| scenario | side | payload | round trip | runs |\n|---|---|---:|---:|---|\n")
	for _, scn := range r.scenarios {
		for _, size := range scn.sizes(r.cfg) {
			for _, delay := range r.cfg.delays {
				for _, name := range scn.sides {
					ss := r.res.samples[key{scn.id, name, size, delay}]
					if len(ss) == 0 {
						continue
					}
					rates := make([]string, len(ss))
					for i, s := range ss {
						rates[i] = formatRate(s.rate())
					}
					fmt.Fprintf(w, "| %s | %s | %d B | %s | %s |\n", scn.id, name, size, r.rttCell(delay), strings.Join(rates, ", "))
				}
			}
		}
	}
	w.WriteString("\n</details>\n")
}

// rttCell is the round trip measured at delay, for a table.
func (r report) rttCell(delay time.Duration) string {
	rtt, ok := r.rtts[delay]
	if !ok {
		return "–"
	}
	return formatDuration(rtt)
}

// describeDistances names the distances of the run with their round trips.
func (r report) describeDistances() string {
	parts := make([]string, 0, len(r.cfg.delays))
	for _, d := range r.cfg.delays {
		if d == 0 {
			parts = append(parts, "loopback (round trip "+r.rttCell(d)+")")
		} else {
			parts = append(parts, fmt.Sprintf("replies delayed %s by a proxy (round trip %s)", d, r.rttCell(d)))
		}
	}
	return strings.Join(parts, "; ")
}

// plural writes a count with its noun: "1 run", "3 runs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func joinInts(xs []int, sep string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, sep)
}

// quoteArgs quotes the arguments that a shell would split or drop.
func quoteArgs(args []string) []string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$\\*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return q
}
