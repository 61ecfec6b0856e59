package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The consume-large scenario measures the peak resident memory of the
// consuming side alone, so each side consumes in a child process of its
// own: this program, started again with childEnv set to a childRun in JSON.
// The parent pre-fills the topic and checks the pending list afterwards;
// the child makes its own client and subscriber, consumes through a router
// and writes a childResult in JSON to its standard output. The peak comes
// from the kernel (the child's maximum resident set size) once it exits.

// childEnv names the environment variable that makes this program a
// consuming child.
const childEnv = "VALKEYSTREAM_BENCH_CHILD"

// childRun is what a child consumes.
type childRun struct {
	Addr  string        `json:"addr"`
	Side  string        `json:"side"`
	Topic string        `json:"topic"`
	Seed  uint64        `json:"seed"`
	N     int           `json:"n"`
	Size  int           `json:"size"`
	Stall time.Duration `json:"stall"`
}

// childResult is what a child reports.
type childResult struct {
	Elapsed    time.Duration `json:"elapsed"`
	Duplicates int64         `json:"duplicates"`
	Deliveries int64         `json:"deliveries"`
	PeakRSS    int64         `json:"peak_rss"` // bytes; 0: not measured
}

// childSpec returns the run this process is to consume as a child, if it is
// one.
func childSpec() (childRun, bool) {
	v, ok := os.LookupEnv(childEnv)
	if !ok {
		return childRun{}, false
	}
	var spec childRun
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		// An unreadable spec fails in runChild, with the cause.
		return childRun{Side: "unreadable " + childEnv + ": " + err.Error()}, true
	}
	return spec, true
}

// runChild consumes spec through a router and writes the result to
// standard output.
func runChild(spec childRun) error {
	sd, ok := sides[spec.Side]
	if !ok || sd.subscriber == nil {
		return fmt.Errorf("child: no adapter side %q", spec.Side)
	}
	c, err := newCorpus(spec.Seed, spec.N, spec.Size)
	if err != nil {
		return fmt.Errorf("child: %w", err)
	}
	ctx := context.Background()
	sc := newScope(spec.Addr)
	defer sc.close()
	sub, err := sd.subscriber(sc, sc.client())
	if err != nil {
		return fmt.Errorf("child: %w", err)
	}
	if err := sc.warm(ctx, 2); err != nil {
		return fmt.Errorf("child: %w", err)
	}
	b := &bench{cfg: config{stall: spec.Stall}}
	tr := newTracker(c, false)
	_, err = b.timeConsume(ctx, tr, func(ctx context.Context) error {
		return consumeRouter(ctx, sub, spec.Topic, tr, false)
	}, nil)
	if err != nil {
		return fmt.Errorf("child: %s on %s: %w", sd.name, spec.Topic, err)
	}
	if err := sc.close(); err != nil {
		return fmt.Errorf("child: %w", err)
	}
	peak, err := ownPeakRSS()
	if err != nil {
		return fmt.Errorf("child: %w", err)
	}
	return json.NewEncoder(os.Stdout).Encode(childResult{
		Elapsed:    tr.elapsed(),
		Duplicates: tr.duplicates.Load(),
		Deliveries: tr.delivered.Load(),
		PeakRSS:    peak,
	})
}

// largeCount is how many messages of size bytes a consume-large run
// carries: -large-mib of payload, and at least 10 messages.
func (b *bench) largeCount(size int) int {
	return max(10, b.cfg.largeMiB<<20/size)
}

// runLargeScenario runs the consume-large scenario for each side at each
// of -large-sizes.
func (b *bench) runLargeScenario(ctx context.Context, scn scenario, rep int) error {
	for _, size := range b.cfg.largeSizes {
		c, err := newCorpus(uint64(rep)<<32|uint64(size), b.largeCount(size), size)
		if err != nil {
			return err
		}
		for _, name := range rotate(scn.sides, rep) {
			s, err := b.runLarge(ctx, scn, sides[name], c)
			if err != nil {
				return fmt.Errorf("%s, %s, %d bytes, repetition %d: %w", scn.id, name, size, rep+1, err)
			}
			b.res.add(key{scn.id, name, size, b.dist.delay}, s)
			b.printSample(rep, scn, name, size, s)
		}
	}
	return nil
}

// runLarge pre-fills a new topic with c, has a child process consume it
// through a router, and checks that nothing is left pending.
func (b *bench) runLarge(ctx context.Context, scn scenario, sd side, c corpus) (sample, error) {
	sc := newScope(b.dist.addr)
	defer sc.close()
	topic := b.topic(scn, sd, c)
	defer b.cleanup(ctx, topic)
	if err := sd.fill(ctx, sc, topic, c); err != nil {
		return sample{}, err
	}
	if err := sc.close(); err != nil {
		return sample{}, err
	}
	res, peakRSS, err := runChildProcess(ctx, childRun{
		Addr: b.dist.addr, Side: sd.name, Topic: topic,
		Seed: c.seed, N: c.n, Size: c.size, Stall: b.cfg.stall,
	})
	if err != nil {
		return sample{}, err
	}
	pending, err := b.pendingAfter(ctx, topic)
	if err != nil {
		return sample{}, err
	}
	if pending > 0 {
		b.describePending(ctx, topic)
	}
	return sample{
		n: c.n, elapsed: res.Elapsed, duplicates: res.Duplicates, pending: pending,
		deliveries: res.Deliveries, peakRSS: peakRSS,
	}, nil
}

// runChildProcess runs this program as a child that consumes run, and
// returns its result and its peak resident memory in bytes.
func runChildProcess(ctx context.Context, run childRun) (childResult, int64, error) {
	exe, err := os.Executable()
	if err != nil {
		return childResult{}, 0, fmt.Errorf("finding this program to start a child: %w", err)
	}
	spec, err := json.Marshal(run)
	if err != nil {
		return childResult{}, 0, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = serverProcAttr()
	err = cmd.Run()
	if err != nil {
		return childResult{}, 0, fmt.Errorf("the consuming child failed: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var res childResult
	if err := json.NewDecoder(io.LimitReader(&stdout, 1<<20)).Decode(&res); err != nil {
		return childResult{}, 0, fmt.Errorf("reading the child's result %q: %w", stdout.String(), err)
	}
	return res, res.PeakRSS, nil
}
