// Command bench measures valkeystream against watermill-redisstream side by
// side, against the same private Redis or Valkey server in one run, and
// writes the results as Markdown with an SVG chart.
//
//	go run -C bench . -out ../docs/benchmarks.md
//	go run -C bench . -delays 0,1ms,2ms -distance-sizes 64 -distance-messages 10000 -out ../docs/benchmarks.md
//
// Run it with -h for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = `Usage: go run -C bench . [flags]

Measures valkeystream against watermill-redisstream (and go-redis alone and
Watermill's gochannel as references) on a private server, and writes a
Markdown report with an SVG chart. Scenarios: publish (64 goroutines, one,
100 per call), consume (router, channel, 1% Nacked), transform (a router
handler returning one output per input, plain and under ExactlyOnce: the
cost of exactly-once outputs, in the same run), latency (publish to
handler at fixed rates), consume-large (64 KiB and 1 MiB payloads in a
child process, with its peak RSS), many-topics (one Subscriber, one
default client, a handler per topic), memory (heap over a backlog), and
the cost of metrics and of idempotent publishing (publish-idempotent and
publish-idempotent-single: plain publishing against IdempotentWindow on the
server's own path and on the script path, in the same run), and
partitioned topics: partition-cost (one subscription through a router on a
topic of 1 and of 8 partitions against a plain topic: rate and
allocations), partition-scale-router and partition-scale-channel (a topic
of 16 partitions, keyed messages, a 1 ms handler, 1, 2, 4, 8
subscriptions: rate against linear scaling).

Every scenario at loopback and at two simulated network distances:

  go run -C bench . -delays 0,1ms,2ms -distance-sizes 64 -distance-messages 10000 \
    -out ../docs/benchmarks.md

Flags:
`

type config struct {
	out, chart string
	serverBin  string
	addr       string
	flush      bool
	reps       int
	sizes      []int
	publishN   int
	consumeN   int
	memoryNs   []int
	scenarios  string
	sides      string
	stall      time.Duration
	cpuProfile string
	memProfile string

	delays []time.Duration // added to the server's replies; 0 is loopback
	// at delays above 0: payload sizes (nil: sizes) and the most messages
	// per publish or consume run (0: as at loopback)
	distanceSizes    []int
	distanceMessages int

	latencyRates    []int
	latencyDuration time.Duration

	largeSizes []int
	largeMiB   int

	topicCounts []int
	topicPeriod time.Duration
	topicRounds int
	topicStart  time.Duration

	partitionSubs []int // scale scenarios: counts of subscriptions
	partitionN    int   // scale scenarios: messages per run

	args []string // as given, for the report
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	var sizes, memory, delays, distanceSizes, rates, largeSizes, topics, partitionSubs string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.out, "out", "", "write the Markdown report to this file (default: standard output)")
	fs.StringVar(&cfg.chart, "chart", "", "write the SVG chart to this file (default: -out with the extension .svg; none when -out is empty)")
	fs.StringVar(&cfg.serverBin, "server", "redis-server", "server binary to start privately: redis-server or valkey-server (a name on PATH or a path)")
	fs.StringVar(&cfg.addr, "addr", "", "use the server at host:port instead of starting one")
	fs.BoolVar(&cfg.flush, "flush", false, "allow FLUSHALL between runs on the -addr server (the private server is always flushed)")
	fs.IntVar(&cfg.reps, "reps", 3, "repetitions of every measurement; the report gives medians")
	fs.StringVar(&sizes, "sizes", "16,64,256", "payload sizes in bytes, comma-separated (at least 8)")
	fs.IntVar(&cfg.publishN, "publish-messages", 30000, "messages per publish run")
	fs.IntVar(&cfg.consumeN, "consume-messages", 50000, "pre-filled messages per consume run")
	fs.StringVar(&memory, "memory-entries", "200000,1000000", "backlogs of the memory scenario, comma-separated (empty: skip it)")
	fs.StringVar(&cfg.scenarios, "scenarios", "all", "scenarios to run, comma-separated: "+scenarioIDs())
	fs.StringVar(&cfg.sides, "sides", "", "run only these sides, comma-separated (default: all): "+strings.Join(chartSides, ", "))
	fs.DurationVar(&cfg.stall, "stall", 30*time.Second, "fail a consume run when no message succeeded for this long")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&cfg.memProfile, "memprofile", "", "write a profile of the allocations of the whole run to this file (go tool pprof -sample_index=alloc_space)")
	fs.StringVar(&delays, "delays", "0", "network distances: delays added to the server's replies by a proxy, comma-separated (e.g. 0,1ms,2ms); 0 is plain loopback. Every scenario runs at each; the report gives each figure with the round trip measured there (median of 101 PINGs)")
	fs.StringVar(&distanceSizes, "distance-sizes", "", "payload sizes of the publish and consume scenarios at delays above 0 (default: -sizes)")
	fs.IntVar(&cfg.distanceMessages, "distance-messages", 0, "at delays above 0, at most this many messages per publish or consume run (default: as at loopback); a side that pays a round trip per message takes minutes per run at a few milliseconds")
	fs.StringVar(&rates, "latency-rates", "1000,10000", "latency scenario: publish rates in messages per second, comma-separated")
	fs.DurationVar(&cfg.latencyDuration, "latency-duration", 5*time.Second, "latency scenario: how long to publish at each rate")
	fs.StringVar(&largeSizes, "large-sizes", "65536,1048576", "consume-large scenario: payload sizes in bytes, comma-separated")
	fs.IntVar(&cfg.largeMiB, "large-mib", 256, "consume-large scenario: MiB of payload per run (messages: this divided by the size, at least 10)")
	fs.StringVar(&topics, "topics", "100", "many-topics scenario: topic counts, comma-separated (e.g. 100,1000)")
	fs.DurationVar(&cfg.topicPeriod, "topics-period", time.Second, "many-topics scenario: one message per topic per period")
	fs.IntVar(&cfg.topicRounds, "topics-rounds", 5, "many-topics scenario: periods to publish for")
	fs.DurationVar(&cfg.topicStart, "topics-start", 30*time.Second, "many-topics scenario: how long to wait for every subscription to start before giving up on the run")
	fs.StringVar(&partitionSubs, "partition-subscriptions", "1,2,4,8", "partition-scale scenarios: counts of subscriptions, comma-separated (at most 16, the partitions)")
	fs.IntVar(&cfg.partitionN, "partition-messages", 20000, "partition-scale scenarios: messages per run (at delays above 0, at most -distance-messages)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var err error
	if cfg.sizes, err = parseInts(sizes, 8); err != nil {
		return config{}, fmt.Errorf("-sizes: %w", err)
	}
	if cfg.memoryNs, err = parseInts(memory, 1); err != nil {
		return config{}, fmt.Errorf("-memory-entries: %w", err)
	}
	if cfg.delays, err = parseDurations(delays); err != nil {
		return config{}, fmt.Errorf("-delays: %w", err)
	}
	if cfg.distanceSizes, err = parseInts(distanceSizes, seqDigits); err != nil {
		return config{}, fmt.Errorf("-distance-sizes: %w", err)
	}
	if cfg.latencyRates, err = parseInts(rates, 1); err != nil {
		return config{}, fmt.Errorf("-latency-rates: %w", err)
	}
	if cfg.largeSizes, err = parseInts(largeSizes, seqDigits); err != nil {
		return config{}, fmt.Errorf("-large-sizes: %w", err)
	}
	if cfg.topicCounts, err = parseInts(topics, 1); err != nil {
		return config{}, fmt.Errorf("-topics: %w", err)
	}
	if cfg.partitionSubs, err = parseInts(partitionSubs, 1); err != nil {
		return config{}, fmt.Errorf("-partition-subscriptions: %w", err)
	}
	switch {
	case slices.ContainsFunc(cfg.partitionSubs, func(k int) bool { return k > scalePartitions }):
		return config{}, fmt.Errorf("-partition-subscriptions: at most %d, the partitions", scalePartitions)
	case cfg.partitionN < 1:
		return config{}, errors.New("-partition-messages must be at least 1")
	case cfg.reps < 1:
		return config{}, errors.New("-reps must be at least 1")
	case cfg.publishN < 1 || cfg.consumeN < 1:
		return config{}, errors.New("-publish-messages and -consume-messages must be at least 1")
	case cfg.stall < 100*time.Millisecond:
		return config{}, errors.New("-stall must be at least 100ms")
	case cfg.latencyDuration < 10*time.Millisecond:
		return config{}, errors.New("-latency-duration must be at least 10ms")
	case cfg.distanceMessages < 0:
		return config{}, errors.New("-distance-messages must be at least 0")
	case cfg.largeMiB < 1:
		return config{}, errors.New("-large-mib must be at least 1")
	case cfg.topicPeriod < time.Millisecond || cfg.topicRounds < 1:
		return config{}, errors.New("-topics-period must be at least 1ms and -topics-rounds at least 1")
	case cfg.topicStart < time.Second:
		return config{}, errors.New("-topics-start must be at least 1s")
	}
	if cfg.chart == "" && cfg.out != "" {
		cfg.chart = strings.TrimSuffix(cfg.out, filepath.Ext(cfg.out)) + ".svg"
	}
	cfg.args = args
	return cfg, nil
}

// allSizes is every payload size the publish and consume scenarios run at,
// at any distance.
func (cfg config) allSizes() []int {
	all := slices.Clone(cfg.sizes)
	for _, size := range cfg.distanceSizes {
		if !slices.Contains(all, size) {
			all = append(all, size)
		}
	}
	return all
}

// parseInts reads a comma-separated list of integers of at least least.
func parseInts(list string, least int) ([]int, error) {
	var xs []int
	for f := range strings.SplitSeq(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		x, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		if x < least {
			return nil, fmt.Errorf("%d is below %d", x, least)
		}
		xs = append(xs, x)
	}
	return xs, nil
}

// parseDurations reads a comma-separated list of durations of at least 0;
// an empty list is loopback alone.
func parseDurations(list string) ([]time.Duration, error) {
	var ds []time.Duration
	for f := range strings.SplitSeq(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration such as 0, 800us or 2.5ms", f)
		}
		if d < 0 {
			return nil, fmt.Errorf("%s is negative", d)
		}
		if slices.Contains(ds, d) {
			return nil, fmt.Errorf("%s is given twice", d)
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		ds = []time.Duration{0}
	}
	return ds, nil
}

func main() {
	target, delay, isProxy, err := proxySpec()
	switch spec, isChild := childSpec(); {
	case err != nil:
	case isProxy:
		err = runProxyChild(target, delay)
	case isChild:
		err = runChild(spec)
	default:
		err = run(os.Args[1:])
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg, err := parseFlags(args, os.Stderr)
	if err != nil {
		return err
	}
	picked, memory, err := selectScenarios(cfg.scenarios)
	if err != nil {
		return err
	}
	if picked, err = selectSides(picked, cfg.sides); err != nil {
		return err
	}
	if !memory {
		cfg.memoryNs = nil
	}

	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	began := time.Now()
	mach := describeMachine()
	var srv *server
	if cfg.addr != "" {
		srv, err = connectServer(ctx, cfg.addr, cfg.flush)
	} else {
		srv, err = startServer(ctx, cfg.serverBin)
	}
	if err != nil {
		return err
	}
	defer srv.remove()
	defer srv.stop()
	b := &bench{cfg: cfg, srv: srv, admin: srv.newClient(), res: newResults(), progress: os.Stderr}
	defer b.admin.Close()
	fmt.Fprintf(b.progress, "server: %s at %s\n", srv.describe(), srv.addr)
	if err := srv.reset(ctx, b.admin); err != nil {
		return err
	}

	if cfg.cpuProfile != "" {
		stop, err := startCPUProfile(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if cfg.memProfile != "" {
		defer writeAllocProfile(cfg.memProfile, b.progress)
	}
	goroutines := runtime.NumGoroutine()
	if err := b.runAll(ctx, picked); err != nil {
		return err
	}
	leaks := waitForGoroutines(goroutines, 5*time.Second)
	if leaks != "" {
		fmt.Fprintln(b.progress, "warning:", leaks)
	}
	mach.loadEnd = loadAverage()

	rep := report{
		cfg: cfg, machine: mach, server: srv.describe(), scenarios: picked,
		res: b.res, samples: samples{memory: b.memory, latency: b.latency, topics: b.topics, scale: b.scale}, rtts: b.rtts,
		wall: time.Since(began), leaks: leaks,
	}
	return rep.write()
}
