package main

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{formatRate(0), "0"},
		{formatRate(999.5), "1,000"},
		{formatRate(1234567.4), "1,234,567"},
		{groupThousands(-1234), "-1,234"},
		{formatRatio(2.3149), "2.31×"},
		{formatRatio(0), "–"},
		{formatPercent(0.456), "46%"},
		{formatBytes(512), "512 B"},
		{formatBytes(1536), "1.5 KiB"},
		{formatBytes(-3 << 20), "-3.0 MiB"},
		{formatDuration(1234 * time.Nanosecond), "1µs"},
		{formatDuration(1234567 * time.Nanosecond), "1.2ms"},
		{formatDuration(1234567890 * time.Nanosecond), "1.235s"},
		{plural(1, "run"), "1 run"},
		{plural(3, "run"), "3 runs"},
		{strings.Join(quoteArgs([]string{"-out", "a b", ""}), " "), "-out 'a b' ''"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// testReport is a report of made-up samples: valkeystream at twice the
// incumbent's rate everywhere.
func testReport(t *testing.T) report {
	t.Helper()
	res := newResults()
	for _, scn := range scenarios {
		if scn.kind != kindThroughput {
			continue
		}
		for _, size := range []int{16, 64} {
			for i, name := range scn.sides {
				for rep := range 3 {
					// 10000 messages in 100, 200 or 400 ms (times 1, 2 or 4 by side).
					elapsed := time.Duration(100*(1<<i)*(1+rep%2)) * time.Millisecond
					res.add(key{scn.id, name, size, 0}, sample{n: 10000, elapsed: elapsed, nacks: 100, deliveries: 10100})
				}
			}
		}
	}
	return report{
		cfg: config{reps: 3, sizes: []int{16, 64}, publishN: 20000, consumeN: 10000,
			delays: []time.Duration{0}, args: []string{"-out", "../docs/benchmarks.md"}},
		rtts:      map[time.Duration]time.Duration{0: 42 * time.Microsecond},
		machine:   machine{cpu: "Test CPU", cores: 2, gomaxprocs: 2, os: "TestOS", goVersion: "go1.26.8"},
		server:    "Redis 7.0.15 (private, non-persistent, on loopback)",
		scenarios: scenarios,
		res:       res,
		samples: samples{memory: []memorySample{
			{n: 200000, elapsed: 2 * time.Second, baseLive: 2 << 20, peakLive: 3 << 20, allocs: 200000 * 1500},
			{n: 1000000, elapsed: 10 * time.Second, baseLive: 9 << 20, peakLive: 10 << 20, allocs: 1000000 * 1500},
		}},
		wall: 3 * time.Minute,
		date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
	}
}

func TestMarkdown(t *testing.T) {
	md := testReport(t).markdown("benchmarks.svg")
	for _, want := range []string{
		"## How to run",
		"go run -C bench . -out ../docs/benchmarks.md",
		"Run on 2026-01-02 03:04 UTC with `go run -C bench . -out ../docs/benchmarks.md`; wall time 3m0s.",
		"| CPU | Test CPU |",
		"| server | Redis 7.0.15 (private, non-persistent, on loopback) |",
		"![Messages per second by scenario, 64-byte payloads](benchmarks.svg)",
		// median of 100, 200, 100 ms: 100,000 msg/s; the incumbent's 50,000.
		"| network distance | loopback (round trip 42µs) |",
		"| publish, 64 goroutines, 1 msg/call | 16 B | 42µs | 100,000 | 50,000 | **2.00×** | go-redis 25,000 | 400% | 200% |",
		"| consume, router handler | 64 B | 42µs | 100,000 | 50,000 | **2.00×** | gochannel 25,000 | 400% | 200% |",
		"| 64 B | 42µs | valkeystream | 100,000 | 100% | 100 | 1.010 |",
		"| 1,000,000 | 0s | 100,000 | 9.0 MiB | 1.0 MiB |",
		"Result: no duplicates, and nothing left pending, in any run.",
		"<details>",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(md, "| consume, channel, 1% Nacked once |") {
		t.Error("the nack scenario appears in the throughput table; it has its own")
	}
}

func TestMarkdownOfExactlyOnceCost(t *testing.T) {
	r := testReport(t)
	for i := range r.res.samples[key{"transform-router", sideExactlyOnce, 64, 0}] {
		s := &r.res.samples[key{"transform-router", sideExactlyOnce, 64, 0}][i]
		s.allocs, s.allocBytes = 850000, 5<<20 // per message: 85 objects, 524 bytes
	}
	md := r.markdown("")
	for _, want := range []string{
		"### Cost of exactly-once outputs",
		// valkeystream 100,000 msg/s, exactly-once 50,000, with state
		// writes 25,000, the incumbent 12,500 (medians).
		"| transform, router, 1 output per input | 64 B | 42µs | 100,000 | 12,500 | **8.00×** |",
		"| 64 B | 42µs | valkeystream | 100,000 | 50,000 to 100,000 | 0 | 0 B | – | – |",
		"| 64 B | 42µs | valkeystream+exactly-once | 50,000 | 25,000 to 50,000 | 85 | 524 B | **0.50×** | 0.50× to 0.50× |",
		"| 64 B | 42µs | valkeystream+exactly-once+state | 25,000 | 12,500 to 25,000 | 0 | 0 B | **0.25×** | 0.25× to 0.25× |",
		"| 64 B | 42µs | watermill-redisstream | 12,500 | 6,250 to 12,500 | 0 | 0 B | – | – |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

func TestMarkdownListsDuplicatesAndPending(t *testing.T) {
	r := testReport(t)
	k := key{"consume-channel", sideIncumbent, 64, 0}
	r.res.samples[k][1].duplicates = 2
	r.res.samples[k][2].pending = 1
	md := r.markdown("")
	if !strings.Contains(md, "| consume-channel, round trip 42µs | watermill-redisstream | 64 B | 2 | 1 |") {
		t.Error("the report does not list the duplicates and pending entries")
	}
	if strings.Contains(md, "no duplicates") || strings.Contains(md, "![") {
		t.Error("the report claims no duplicates, or embeds a chart it was not given")
	}
}

func TestChartIsWellFormedSVG(t *testing.T) {
	svg := testReport(t).chartSVG()
	d := xml.NewDecoder(strings.NewReader(svg))
	rects := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	// One background, a legend key per side, and a bar per side of each scenario.
	bars := 0
	for _, scn := range scenarios {
		if scn.kind == kindThroughput {
			bars += len(scn.sides)
		}
	}
	if want := 1 + len(chartSides) + bars; rects != want {
		t.Errorf("the chart has %d rects, want %d", rects, want)
	}
	if !strings.Contains(svg, "64-byte payloads, median of 3 runs, round trip 42µs") {
		t.Error("the chart's title does not name the payload size and the runs")
	}
}

func TestAxisTicks(t *testing.T) {
	for _, tc := range []struct{ largest, step, top float64 }{
		{316000, 50000, 350000},
		{99000, 20000, 100000},
		{7, 1, 7},
		{1.2e6, 200000, 1.2e6},
	} {
		step, top := axisTicks([]barGroup{{bars: []bar{{sideRaw, tc.largest}}}})
		if step != tc.step || top != tc.top {
			t.Errorf("axisTicks(%v) = %v, %v; want %v, %v", tc.largest, step, top, tc.step, tc.top)
		}
	}
}

func TestParseServerInfo(t *testing.T) {
	redis := "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"
	valkey := "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n"
	if n, v := parseServerInfo(redis); n != "Redis" || v != "7.0.15" {
		t.Errorf("Redis: %s %s", n, v)
	}
	if n, v := parseServerInfo(valkey); n != "Valkey" || v != "8.0.1" {
		t.Errorf("Valkey: %s %s", n, v)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-out", "../docs/benchmarks.md", "-sizes", "16, 64", "-memory-entries", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.chart != "../docs/benchmarks.svg" || len(cfg.sizes) != 2 || cfg.memoryNs != nil || cfg.reps != 3 {
		t.Errorf("parsed %+v", cfg)
	}
	if len(cfg.delays) != 1 || cfg.delays[0] != 0 || len(cfg.latencyRates) != 2 || len(cfg.largeSizes) != 2 || len(cfg.topicCounts) != 1 {
		t.Errorf("defaults: delays %v, latency rates %v, large sizes %v, topics %v", cfg.delays, cfg.latencyRates, cfg.largeSizes, cfg.topicCounts)
	}
	cfg, err = parseFlags([]string{"-delays", "0,1ms,2.5ms", "-topics", "100,1000", "-large-sizes", "65536",
		"-sizes", "16,64", "-distance-sizes", "64,1024", "-distance-messages", "5000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := joinInts(cfg.allSizes(), ","); got != "16,64,1024" || cfg.distanceMessages != 5000 {
		t.Errorf("all sizes %s, distance messages %d; want 16,64,1024 and 5000", got, cfg.distanceMessages)
	}
	if len(cfg.delays) != 3 || cfg.delays[2] != 2500*time.Microsecond || len(cfg.topicCounts) != 2 || cfg.largeSizes[0] != 65536 {
		t.Errorf("parsed delays %v, topics %v, large sizes %v", cfg.delays, cfg.topicCounts, cfg.largeSizes)
	}
	for _, bad := range [][]string{{"-sizes", "4"}, {"-reps", "0"}, {"-sizes", "x"}, {"extra"},
		{"-delays", "1"}, {"-distance-messages", "-1"}, {"-distance-sizes", "4"}, {"-latency-rates", "0"}, {"-large-mib", "0"}, {"-topics-start", "10ms"}, {"-large-sizes", "4"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted it", bad)
		}
	}
	if _, _, err := selectScenarios("consume-nack,nope"); err == nil {
		t.Error("an unknown scenario was accepted")
	}
	picked, memory, err := selectScenarios("memory,publish-batch")
	if err != nil || len(picked) != 1 || picked[0].id != "publish-batch" || !memory {
		t.Errorf("selectScenarios = %v, %v, %v", picked, memory, err)
	}
}

func TestMarkdownOfDistancesLatencyLargeAndTopics(t *testing.T) {
	const ms = time.Millisecond
	r := testReport(t)
	r.cfg.delays = []time.Duration{0, ms}
	r.cfg.latencyRates, r.cfg.latencyDuration = []int{1000}, 5*time.Second
	r.cfg.largeSizes, r.cfg.largeMiB = []int{1 << 20}, 64
	r.cfg.topicStart, r.cfg.topicPeriod, r.cfg.topicRounds = 30*time.Second, time.Second, 5
	r.rtts[ms] = 1100 * time.Microsecond
	r.res.add(key{"consume-router", sideValkeystream, 64, ms}, sample{n: 1000, elapsed: 100 * ms})
	r.res.add(key{"consume-large", sideIncumbent, 1 << 20, ms}, sample{n: 64, elapsed: 2 * time.Second, peakRSS: 30 << 20})
	r.samples.latency = []latencySample{
		{side: sideValkeystream, rate: 1000, delay: ms, achieved: 999, stats: latencyStats{n: 5000, p50: 2 * ms, p99: 4 * ms, max: 9 * ms}},
		{side: sideIncumbent, rate: 1000, delay: ms, achieved: 1000, stats: latencyStats{n: 5000, p50: 3 * ms, p99: 8 * ms, max: 20 * ms}},
	}
	r.samples.topics = []topicsSample{
		{side: sideValkeystream, topics: 100, delay: 0, started: 100, startTime: 800 * ms, sent: 500,
			stats: latencyStats{n: 500, p50: ms, p99: 3 * ms, max: 5 * ms}, poolSize: 20, peakConns: 4, serverConns: 105},
		{side: sideIncumbent, topics: 1000, delay: ms, started: 175, startTime: 30 * time.Second, poolSize: 20, peakConns: 20, poolTimeouts: 12},
	}
	for _, sc := range scenarios {
		if sc.kind != kindThroughput {
			r.scenarios = append(r.scenarios, sc)
		}
	}
	md := r.markdown("")
	for _, want := range []string{
		"| network distance | loopback (round trip 42µs); replies delayed 1ms by a proxy (round trip 1.1ms) |",
		"| consume, router handler | 64 B | 1.1ms | 10,000 | – |",
		"| 1.1ms | 1,000/s | valkeystream | 999 | 2ms | 4ms | 9ms | 0.50× |",
		"| 1.1ms | 1,000/s | watermill-redisstream | 1,000 | 3ms | 8ms | 20ms | – |",
		"| 1.0 MiB | 1.1ms | watermill-redisstream | 64 | 32 | 32.0 | 30.0 MiB |",
		"| 100 | 42µs | valkeystream | 800ms | 1ms | 3ms | 5ms | 4 (20) | 0 | 105 |",
		"| 1,000 | 1.1ms | watermill-redisstream | did not start 825 of 1000 within 30s | – | – | – | 20 (20) | 12 | 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	svg := r.chartSVG()
	if !strings.Contains(svg, "consume, router handler, RTT 1.1ms") {
		t.Error("the chart does not name the round trip of each group when there are several")
	}
}
