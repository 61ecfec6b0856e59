package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// topicsSample is one run of the many-topics scenario: one side, one count
// of topics, one Subscriber on one client with go-redis' default options,
// through a router with one handler per topic.
type topicsSample struct {
	side   string
	topics int
	delay  time.Duration

	started   int           // subscriptions that started within the bound
	startTime time.Duration // from Router.Run to every handler subscribed (or the bound)
	startErr  string        // why the router stopped while subscribing, if it did
	sent      int           // messages published (0 when not every subscription started)
	stats     latencyStats
	dups      int64

	poolSize     int    // the client's pool size (go-redis' default)
	peakConns    uint32 // most connections the client held at once
	poolTimeouts uint32 // waits for a connection that timed out
	serverConns  int64  // most connections the server counted above those open before the subscriber started
}

// startFailure says how the subscriptions failed to start.
func (s topicsSample) startFailure() string {
	if s.startErr != "" {
		return fmt.Sprintf("the router stopped after %s with %d of %d subscribed: %s",
			formatDuration(s.startTime), s.started, s.topics, s.startErr)
	}
	return fmt.Sprintf("did not start %d of %d within %s", s.topics-s.started, s.topics, formatDuration(s.startTime))
}

// allStarted reports whether every subscription started within the bound.
func (s topicsSample) allStarted() bool { return s.started == s.topics }

// countingSubscriber counts the subscriptions that began.
type countingSubscriber struct {
	message.Subscriber
	started atomic.Int64
}

func (c *countingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := c.Subscriber.Subscribe(ctx, topic)
	if err == nil {
		c.started.Add(1)
	}
	return ch, err
}

// runTopicsScenario runs the many-topics scenario for each side at each
// count of topics.
func (b *bench) runTopicsScenario(ctx context.Context, scn scenario, rep int) error {
	for _, n := range b.cfg.topicCounts {
		for _, name := range rotate(scn.sides, rep) {
			s, err := b.runTopics(ctx, scn, sides[name], n, rep)
			if err != nil {
				return fmt.Errorf("%s, %s, %d topics, repetition %d: %w", scn.id, name, n, rep+1, err)
			}
			b.topics = append(b.topics, s)
			fmt.Fprintf(b.progress, "rep %d/%d %-18s %-22s %5d topics: %s%s\n",
				rep+1, b.cfg.reps, scn.id, name, n, describeTopics(s), dupNote(s.dups))
		}
	}
	return nil
}

// describeTopics is a run of the many-topics scenario in one line.
func describeTopics(s topicsSample) string {
	conns := fmt.Sprintf("%d connections at most (pool of %d, %d pool timeouts), %d more at the server", s.peakConns, s.poolSize, s.poolTimeouts, s.serverConns)
	if !s.allStarted() {
		return s.startFailure() + "; " + conns
	}
	return fmt.Sprintf("started in %s, p50 %s, p99 %s, max %s over %d messages; %s",
		formatDuration(s.startTime), formatDuration(s.stats.p50), formatDuration(s.stats.p99),
		formatDuration(s.stats.max), s.sent, conns)
}

// runTopics starts a router with one handler per topic on one Subscriber,
// times the start of every subscription (bounded by -topics-start), then
// publishes one message per topic per period, spread evenly over the
// period, for -topics-rounds periods, and books the latency of each.
func (b *bench) runTopics(ctx context.Context, scn scenario, sd side, topics, rep int) (topicsSample, error) {
	rounds := b.cfg.topicRounds
	c, err := newCorpus(uint64(rep)<<32|uint64(topics), topics*rounds, latencySize)
	if err != nil {
		return topicsSample{}, err
	}
	sc := newScope(b.dist.addr)
	defer sc.close()
	base := b.topic(scn, sd, c)
	names := make([]string, topics)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", base, i)
	}
	defer func() {
		for _, t := range names {
			if err := b.admin.Del(ctx, t).Err(); err != nil {
				fmt.Fprintf(b.progress, "warning: deleting %s: %v\n", t, err)
				break
			}
		}
	}()

	pub, err := sd.publisher(sc)
	if err != nil {
		return topicsSample{}, err
	}
	// Only the publisher's client is warmed: the subscriber's connections
	// are what this scenario counts.
	if err := sc.warm(ctx, publishWorkers); err != nil {
		return topicsSample{}, err
	}
	client := sc.defaultClient()
	inner, err := sd.subscriber(sc, client)
	if err != nil {
		return topicsSample{}, err
	}
	sub := &countingSubscriber{Subscriber: inner}
	book := newLatencyBook(c)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return topicsSample{}, fmt.Errorf("creating the router: %w", err)
	}
	for i, t := range names {
		router.AddConsumerHandler(fmt.Sprintf("topic-%d", i), t, sub, func(msg *message.Message) error {
			book.handle(msg, time.Now())
			return nil
		})
	}
	s := topicsSample{side: sd.name, topics: topics, delay: b.dist.delay, poolSize: client.Options().PoolSize}
	conns := startPoolWatch(client, 10*time.Millisecond)
	defer conns.stop()
	server, err := startServerWatch(ctx, b.admin, 10*time.Millisecond)
	if err != nil {
		return topicsSample{}, err
	}
	defer server.stop()

	began := time.Now()
	stopRouter, err := runRouter(ctx, router, b.cfg.topicStart)
	s.startTime = time.Since(began)
	s.started = int(sub.started.Load())
	if err != nil {
		// Not every subscription started: that is the result, not a
		// failure of the benchmark.
		s.peakConns, s.poolTimeouts = conns.stop()
		s.serverConns = server.stop()
		if ctx.Err() != nil {
			return topicsSample{}, ctx.Err()
		}
		if errors.Is(err, errRouterNotRunning) {
			s.startTime = b.cfg.topicStart
		} else {
			s.startErr = err.Error()
		}
		if stopRouter != nil {
			if err := stopRouter(); err != nil {
				// Watermill's router counts a handler that never subscribed
				// as running: its Close waits out CloseTimeout and leaves
				// two goroutines behind.
				fmt.Fprintf(b.progress, "note: %v\n", err)
			}
		}
		return s, nil
	}
	defer stopRouter()

	plan := make([]pacedMessage, 0, c.n)
	for r := range rounds {
		for i, t := range names {
			due := time.Duration(r)*b.cfg.topicPeriod + time.Duration(i)*b.cfg.topicPeriod/time.Duration(topics)
			plan = append(plan, pacedMessage{topic: t, seq: r*topics + i, due: due})
		}
	}
	if _, err := publishPaced(ctx, pub, c, plan); err != nil {
		return topicsSample{}, err
	}
	s.sent = c.n
	if err := book.wait(ctx, b.cfg.stall); err != nil {
		return topicsSample{}, fmt.Errorf("%s, %d topics: %w", sd.name, topics, err)
	}
	s.stats, s.dups = book.stats(), book.dups.Load()
	s.peakConns, s.poolTimeouts = conns.stop()
	s.serverConns = server.stop()
	if err := stopRouter(); err != nil {
		return topicsSample{}, err
	}
	if err := sc.close(); err != nil {
		return topicsSample{}, err
	}
	return s, nil
}

// poolWatch samples a client's pool until stopped.
type poolWatch struct {
	client *redis.Client
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	peak   uint32
}

func startPoolWatch(client *redis.Client, every time.Duration) *poolWatch {
	w := &poolWatch{client: client, done: make(chan struct{})}
	w.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			w.peak = max(w.peak, client.PoolStats().TotalConns)
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	})
	return w
}

// stop ends the sampling and returns the most connections seen at once and
// the pool's timeouts so far. Later calls return the same.
func (w *poolWatch) stop() (peak, timeouts uint32) {
	w.once.Do(func() {
		close(w.done)
		w.wg.Wait()
		w.peak = max(w.peak, w.client.PoolStats().TotalConns)
	})
	return w.peak, w.client.PoolStats().Timeouts
}

// serverWatch samples the server's count of connected clients until
// stopped. It counts every connection of the subscriber, those of clients
// it makes of its own too, which the pool of the client it was given does
// not show.
type serverWatch struct {
	admin *redis.Client
	base  int64
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	peak  int64
}

func startServerWatch(ctx context.Context, admin *redis.Client, every time.Duration) (*serverWatch, error) {
	base, err := connectedClients(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("counting the server's connections: %w", err)
	}
	w := &serverWatch{admin: admin, base: base, done: make(chan struct{})}
	w.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if n, err := connectedClients(ctx, admin); err == nil {
				w.peak = max(w.peak, n-w.base)
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	})
	return w, nil
}

// stop ends the sampling and returns the most connections seen above the
// base. Later calls return the same.
func (w *serverWatch) stop() int64 {
	w.once.Do(func() {
		close(w.done)
		w.wg.Wait()
	})
	return w.peak
}

// connectedClients returns the server's connected_clients.
func connectedClients(ctx context.Context, admin *redis.Client) (int64, error) {
	info, err := admin.Info(ctx, "clients").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("INFO clients has no connected_clients")
}
