// Command bench measures valkeystream against watermill-redisstream side by
// side, against the same private Redis or Valkey server in one run, and
// writes the results as Markdown with an SVG chart.
//
//	go run -C bench . -out ../docs/benchmarks.md
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
	"strconv"
	"strings"
	"syscall"
	"time"
)

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
	args       []string // as given, for the report
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	var sizes, memory string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	switch {
	case cfg.reps < 1:
		return config{}, errors.New("-reps must be at least 1")
	case cfg.publishN < 1 || cfg.consumeN < 1:
		return config{}, errors.New("-publish-messages and -consume-messages must be at least 1")
	case cfg.stall < 100*time.Millisecond:
		return config{}, errors.New("-stall must be at least 100ms")
	}
	if cfg.chart == "" && cfg.out != "" {
		cfg.chart = strings.TrimSuffix(cfg.out, filepath.Ext(cfg.out)) + ".svg"
	}
	cfg.args = args
	return cfg, nil
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

func main() {
	err := run(os.Args[1:])
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
		res: b.res, memory: b.memory, wall: time.Since(began), leaks: leaks,
	}
	return rep.write()
}
