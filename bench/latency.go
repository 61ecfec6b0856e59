package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// publishedAtKey is the metadata entry that carries when the Publish call of
// a message began, in Unix nanoseconds.
const publishedAtKey = "bench_published_at"

// latencySize is the payload size of the latency and many-topics scenarios.
const latencySize = 64

// publishWorkers is how many goroutines publish at a fixed rate: enough for
// one message per call to keep up with 10,000/s at a few milliseconds of
// round trip, whatever the adapter.
const publishWorkers = 64

// latencyStats summarises the latencies of one run.
type latencyStats struct {
	n             int
	p50, p99, max time.Duration
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted, by the
// nearest-rank method: the smallest value that at least p% of the values do
// not exceed. 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// summarize returns the count, p50, p99 and max of ds, which it sorts.
func summarize(ds []time.Duration) latencyStats {
	slices.Sort(ds)
	s := latencyStats{n: len(ds), p50: percentile(ds, 50), p99: percentile(ds, 99)}
	if len(ds) > 0 {
		s.max = ds[len(ds)-1]
	}
	return s
}

// latencyBook records, for each message of a corpus, the time from its
// Publish call to the start of its first handling.
type latencyBook struct {
	c       corpus
	since   []atomic.Int64 // nanoseconds; 0 until handled
	handled atomic.Int64   // distinct messages handled
	dups    atomic.Int64   // handlings beyond the first
	invalid atomic.Int64   // deliveries without a sequence number or a time
	done    chan struct{}  // closed when every message was handled
	once    sync.Once
}

func newLatencyBook(c corpus) *latencyBook {
	return &latencyBook{c: c, since: make([]atomic.Int64, c.n), done: make(chan struct{})}
}

// handle books the start of a handling of msg, at now.
func (l *latencyBook) handle(msg *message.Message, now time.Time) {
	seq, ok := parseSeq(msg.Payload)
	at, err := strconv.ParseInt(msg.Metadata.Get(publishedAtKey), 10, 64)
	if !ok || seq >= l.c.n || err != nil {
		l.invalid.Add(1)
		return
	}
	if !l.since[seq].CompareAndSwap(0, max(1, now.UnixNano()-at)) {
		l.dups.Add(1)
		return
	}
	if l.handled.Add(1) == int64(l.c.n) {
		l.once.Do(func() { close(l.done) })
	}
}

// stats summarises the latencies of the messages handled so far.
func (l *latencyBook) stats() latencyStats {
	ds := make([]time.Duration, 0, l.c.n)
	for i := range l.since {
		if v := l.since[i].Load(); v != 0 {
			ds = append(ds, time.Duration(v))
		}
	}
	return summarize(ds)
}

// wait returns when every message was handled, or an error when ctx ends or
// none was handled for stall.
func (l *latencyBook) wait(ctx context.Context, stall time.Duration) error {
	tick := time.NewTicker(stall / 10)
	defer tick.Stop()
	last, lastChange := l.handled.Load(), time.Now()
	for {
		select {
		case <-l.done:
			if bad := l.invalid.Load(); bad > 0 {
				return fmt.Errorf("%d deliveries carried no sequence number or publish time", bad)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if now := l.handled.Load(); now != last {
				last, lastChange = now, time.Now()
			} else if time.Since(lastChange) >= stall {
				return fmt.Errorf("no message handled for %s: %d of %d handled", stall, now, l.c.n)
			}
		}
	}
}

// A pacedMessage is one message of a fixed-rate schedule: sent to topic at
// due (from the schedule's start).
type pacedMessage struct {
	topic string
	seq   int
	due   time.Duration
}

// publishPaced publishes each message of plan, in order, no earlier than
// its due time, from publishWorkers goroutines (one message per call), and
// sets publishedAtKey just before each call. It returns the time from the
// start to the last call's return, and the first error.
func publishPaced(ctx context.Context, pub message.Publisher, c corpus, plan []pacedMessage) (time.Duration, error) {
	jobs := make(chan pacedMessage, publishWorkers)
	var failed atomic.Bool
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range publishWorkers {
		wg.Go(func() {
			for j := range jobs {
				if failed.Load() {
					continue
				}
				msg := c.message(j.seq)
				msg.Metadata.Set(publishedAtKey, strconv.FormatInt(time.Now().UnixNano(), 10))
				if err := pub.Publish(j.topic, msg); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("publishing to %s: %w", j.topic, err) })
					failed.Store(true)
				}
			}
		})
	}
	start := time.Now()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
dispatch:
	for _, j := range plan {
		if wait := time.Until(start.Add(j.due)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				break dispatch
			}
		}
		if failed.Load() {
			break
		}
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return elapsed, firstErr
	}
	return elapsed, ctx.Err()
}

// latencySample is one run of the latency scenario: one side at one rate.
type latencySample struct {
	side     string
	rate     int           // messages per second asked for
	delay    time.Duration // the distance
	achieved float64       // messages per second the publishers reached
	stats    latencyStats
	dups     int64
}

// runLatencyScenario runs the latency scenario for each side at each rate.
func (b *bench) runLatencyScenario(ctx context.Context, scn scenario, rep int) error {
	for _, rate := range b.cfg.latencyRates {
		for _, name := range rotate(scn.sides, rep) {
			s, err := b.runLatency(ctx, scn, sides[name], rate, rep)
			if err != nil {
				return fmt.Errorf("%s, %s, %d msg/s, repetition %d: %w", scn.id, name, rate, rep+1, err)
			}
			b.latency = append(b.latency, s)
			fmt.Fprintf(b.progress, "rep %d/%d %-18s %-22s %6d msg/s asked, %6s reached: p50 %s, p99 %s, max %s%s\n",
				rep+1, b.cfg.reps, scn.id, name, rate, formatRate(s.achieved),
				formatDuration(s.stats.p50), formatDuration(s.stats.p99), formatDuration(s.stats.max), dupNote(s.dups))
		}
	}
	return nil
}

func dupNote(dups int64) string {
	if dups == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d DUPLICATES)", dups)
}

// runLatency subscribes one router handler to a new topic, then publishes
// at rate for -latency-duration and books the time from each Publish call
// to its handler.
func (b *bench) runLatency(ctx context.Context, scn scenario, sd side, rate, rep int) (latencySample, error) {
	n := max(1, int(float64(rate)*b.cfg.latencyDuration.Seconds()))
	c, err := newCorpus(uint64(rep)<<32|uint64(rate), n, latencySize)
	if err != nil {
		return latencySample{}, err
	}
	sc := newScope(b.dist.addr)
	defer sc.close()
	topic := b.topic(scn, sd, c)
	defer b.cleanup(ctx, topic)
	pub, sub, err := latencyPubSub(sc, sd)
	if err != nil {
		return latencySample{}, err
	}
	book := newLatencyBook(c)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return latencySample{}, fmt.Errorf("creating the router: %w", err)
	}
	router.AddConsumerHandler("latency", topic, sub, func(msg *message.Message) error {
		book.handle(msg, time.Now())
		return nil
	})
	stopRouter, err := runRouter(ctx, router, 30*time.Second)
	if err != nil {
		if stopRouter != nil {
			err = errors.Join(err, stopRouter())
		}
		return latencySample{}, err
	}
	defer stopRouter()
	if err := sc.warm(ctx, publishWorkers); err != nil {
		return latencySample{}, err
	}

	plan := make([]pacedMessage, n)
	for i := range plan {
		plan[i] = pacedMessage{topic: topic, seq: i, due: time.Duration(float64(i) / float64(rate) * float64(time.Second))}
	}
	elapsed, err := publishPaced(ctx, pub, c, plan)
	if err != nil {
		return latencySample{}, err
	}
	if err := book.wait(ctx, b.cfg.stall); err != nil {
		return latencySample{}, fmt.Errorf("%s on %s: %w", sd.name, topic, err)
	}
	if err := stopRouter(); err != nil {
		return latencySample{}, err
	}
	if err := sc.close(); err != nil {
		return latencySample{}, err
	}
	return latencySample{
		side: sd.name, rate: rate, delay: b.dist.delay,
		achieved: sample{n: n, elapsed: elapsed}.rate(),
		stats:    book.stats(),
		dups:     book.dups.Load(),
	}, nil
}

// latencyPubSub returns the side's publisher and a subscriber for a topic
// that is subscribed to before anything is published: the adapters'
// defaults, and gochannel not persistent.
func latencyPubSub(sc *scope, sd side) (message.Publisher, message.Subscriber, error) {
	if sd.name == sideGoChannel {
		pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		sc.onClose("gochannel", pubSub.Close)
		return pubSub, pubSub, nil
	}
	if sd.publisher == nil || sd.subscriber == nil {
		return nil, nil, fmt.Errorf("side %s has no publisher and subscriber", sd.name)
	}
	pub, err := sd.publisher(sc)
	if err != nil {
		return nil, nil, err
	}
	sub, err := sd.subscriber(sc, sc.client())
	if err != nil {
		return nil, nil, err
	}
	return pub, sub, nil
}

// errRouterNotRunning is the error of runRouter when the router's handlers
// have not all subscribed within its limit.
var errRouterNotRunning = errors.New("the router did not start its handlers")

// runRouter runs router until the returned stop is called, and returns once
// every handler has subscribed. When that takes longer than limit it
// returns stop with an error that wraps errRouterNotRunning, so that the
// caller can look at the router before stopping it; when the router stops
// by itself it returns the router's error, and stop is nil. stop closes the
// router and waits (up to limit each) for Close and Run to return; it may be
// called more than once.
func runRouter(ctx context.Context, router *message.Router, limit time.Duration) (stop func() error, err error) {
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- router.Run(runCtx) }()
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() {
			select {
			case <-router.Running():
			default:
				// Still subscribing: Router.Close waits for the handler
				// being subscribed, so end that first.
				cancel()
			}
			closed := make(chan error, 1)
			go func() { closed <- router.Close() }()
			var closeErr, runErr error
			select {
			case closeErr = <-closed:
			case <-time.After(limit):
				closeErr = fmt.Errorf("Router.Close did not return within %s", limit)
			}
			cancel()
			select {
			case runErr = <-ran:
			case <-time.After(limit):
				runErr = fmt.Errorf("Router.Run did not return within %s", limit)
			}
			stopErr = errors.Join(closeErr, runErr)
			if stopErr != nil {
				stopErr = fmt.Errorf("closing the router: %w", stopErr)
			}
		})
		return stopErr
	}
	select {
	case <-router.Running():
		return stop, nil
	case err := <-ran:
		// Handlers that did subscribe run until the router is closed.
		_ = router.Close()
		cancel()
		if err == nil {
			err = errors.New("it stopped before running")
		}
		return nil, fmt.Errorf("running the router: %w", err)
	case <-time.After(limit):
		return stop, fmt.Errorf("%w within %s", errRouterNotRunning, limit)
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), stop())
	}
}
