package valkeystream_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// Bounds on what one subscription may log and count as failed calls during
// one disruption (a server outage of up to 2 s, a 2 s CLIENT PAUSE, a killed
// connection; a longer outage gets them once per 2 s begun). They are counts, not timings: the backoff (100 ms doubling)
// allows about five failed calls in 2 s, and each other kind of failure
// (hold beat, Ack flush) is logged once per streak. A loop that spins or logs
// every retry of a chore goes far beyond them.
const (
	maxErrorLinesPerDisruption = 10
	maxFaultsPerDisruption     = 20
)

// TestServerCrashEverySuccessfulPublishIsDelivered kills the server with
// SIGKILL three times while publishers write and two group subscriptions
// consume, and starts it again from its append-only file (fsynced on every
// write). Every message whose Publish returned nil must be handled, and
// nothing may stay pending. A Publish that failed may or may not have been
// written; if it was, its messages are delivered like any other.
func TestServerCrashEverySuccessfulPublishIsDelivered(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	if !srv.Restartable() {
		t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be killed by the test: this audit needs a private server")
	}
	r := newServerCrashRun(t, srv, serverCrashOptions{messages: 9000})
	r.run([]serverDisruption{
		serverKill(srv, 300*time.Millisecond),
		serverKill(srv, time.Second),
		serverKill(srv, 2*time.Second),
	})
}

// TestServerCrashClientKill kills the connections of the publishers and the
// subscriptions from an admin client mid-stream (CLIENT KILL), five times:
// every loop must resume by itself and nothing may be lost.
func TestServerCrashClientKill(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	r := newServerCrashRun(t, srv, serverCrashOptions{messages: 6000})
	var disruptions []serverDisruption
	for i := range 5 {
		disruptions = append(disruptions, r.clientKill(i%2 == 0 && srv.Restartable()))
	}
	r.run(disruptions)
}

// TestServerCrashClientPause pauses every client (CLIENT PAUSE ALL, then
// WRITE) for 2 s mid-stream. The client of the publishers and subscriptions
// gives up on a reply after 200 ms (go-redis waits longer for a blocking
// read: its BLOCK time plus 10 s), so calls other than the blocking read fail
// during the pause, even after go-redis' own retries: the loops must back off
// rather than spin, log a handful of lines rather than a flood, and resume by
// themselves once the pause ends, losing nothing.
func TestServerCrashClientPause(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	r := newServerCrashRun(t, srv, serverCrashOptions{messages: 6000, readTimeout: 200 * time.Millisecond})
	r.run([]serverDisruption{r.clientPause("ALL"), r.clientPause("WRITE")})
}

// serverKill kills the server with SIGKILL, keeps it down for outage, and
// starts it again from its append-only file.
func serverKill(srv *testserver.Server, outage time.Duration) serverDisruption {
	return serverDisruption{
		name:  fmt.Sprintf("SIGKILL, down %s", outage),
		spans: int((outage + 2*time.Second - 1) / (2 * time.Second)),
		do: func() error {
			if err := srv.Kill(); err != nil {
				return err
			}
			time.Sleep(outage) // the time is the scenario: the outage
			return srv.StartAgain()
		},
	}
}

// clientKill kills connections from the admin client: every normal
// connection but the admin's own when all is set (only on a private
// server), else only this run's connections, by id, found by their name in
// CLIENT LIST.
func (r *serverCrashRun) clientKill(all bool) serverDisruption {
	ctx := context.Background()
	if all {
		return serverDisruption{
			name: "CLIENT KILL TYPE normal",
			do: func() error {
				// SKIPME yes is the default: the admin keeps its connection.
				n, err := r.admin.ClientKillByFilter(ctx, "TYPE", "normal").Result()
				if err == nil && n == 0 {
					err = fmt.Errorf("CLIENT KILL TYPE normal killed no connection")
				}
				return err
			},
		}
	}
	return serverDisruption{
		name: "CLIENT KILL ID of this test's connections",
		do: func() error {
			ids, err := r.connectionIDs(ctx)
			if err != nil {
				return err
			}
			if len(ids) == 0 {
				return fmt.Errorf("no connection named %s in CLIENT LIST", r.clientName)
			}
			for _, id := range ids {
				// A connection may be gone already; that is fine.
				_ = r.admin.ClientKillByFilter(ctx, "ID", id).Err()
			}
			return nil
		},
	}
}

// clientPause pauses clients for 2 s (mode ALL or WRITE) and returns when
// the pause is over.
func (r *serverCrashRun) clientPause(mode string) serverDisruption {
	return serverDisruption{
		name: "CLIENT PAUSE 2000 " + mode,
		do: func() error {
			if err := r.admin.Do(context.Background(), "CLIENT", "PAUSE", 2000, mode).Err(); err != nil {
				return err
			}
			time.Sleep(2 * time.Second) // the time is the scenario: the pause lasts its 2000 ms
			return nil
		},
	}
}

type serverCrashOptions struct {
	messages    int           // messages that must be published successfully
	readTimeout time.Duration // of the publishers' and subscriptions' client; 0: go-redis default
}

// serverDisruption is one thing done to the server or its connections.
type serverDisruption struct {
	name  string
	spans int // 2 s spans the disruption lasts, for the bounds; 0 counts as 1
	do    func() error
}

// serverCrashRun is one audit: publishers and two group subscriptions in this
// process, a ledger of what was published and what was handled, and a
// counting logger per subscription.
type serverCrashRun struct {
	t          *testing.T
	srv        *testserver.Server
	opts       serverCrashOptions
	admin      *redis.Client
	client     *redis.Client // publishers and subscriptions
	clientName string
	topic      string
	group      string
	pub        *valkeystream.Publisher
	subs       []*crashSubscription

	ok atomic.Int64 // messages published successfully

	mu          sync.Mutex
	published   map[string]bool // Publish returned nil
	failed      map[string]bool // Publish returned an error
	failedCalls int
	received    map[string]map[string]int // uuid -> entry id -> deliveries
}

type crashSubscription struct {
	consumer string
	sub      *valkeystream.Subscriber
	log      *errorLog
}

func newServerCrashRun(t *testing.T, srv *testserver.Server, opts serverCrashOptions) *serverCrashRun {
	t.Helper()
	r := &serverCrashRun{
		t:          t,
		srv:        srv,
		opts:       opts,
		clientName: "vs-crash-" + watermill.NewShortUUID(),
		topic:      "server-crash-" + watermill.NewShortUUID(),
		group:      "audit",
		published:  map[string]bool{},
		failed:     map[string]bool{},
		received:   map[string]map[string]int{},
	}
	// The admin client waits out a CLIENT PAUSE instead of failing.
	r.admin = redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second})
	t.Cleanup(func() { _ = r.admin.Close() })
	r.client = redis.NewClient(&redis.Options{
		Addr:        srv.Addr(),
		ClientName:  r.clientName,
		PoolSize:    32,
		ReadTimeout: opts.readTimeout,
	})
	t.Cleanup(func() { _ = r.client.Close() })
	// The subscriptions' client does not retry by itself, so that every
	// failed call reaches the loop: the bounds on failed calls then measure
	// the loop's own backoff, not go-redis' retries and redials.
	subClient := redis.NewClient(&redis.Options{
		Addr:          srv.Addr(),
		ClientName:    r.clientName,
		ReadTimeout:   opts.readTimeout,
		MaxRetries:    -1,
		DialerRetries: 1,
	})
	t.Cleanup(func() { _ = subClient.Close() })
	var err error
	r.pub, err = valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: r.client}, testLogger())
	require.NoError(t, err)
	for _, consumer := range []string{"c1", "c2"} {
		log := newErrorLog(testLogger())
		sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
			Client:        subClient,
			ConsumerGroup: r.group,
			Consumer:      consumer,
			Start:         valkeystream.StartHead,
			// Short enough that an entry whose read reply was lost comes
			// back within seconds; the rest are the shipped defaults.
			ClaimInterval: 500 * time.Millisecond,
			ClaimMinIdle:  3 * time.Second,
		}, log)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		r.subs = append(r.subs, &crashSubscription{consumer: consumer, sub: sub, log: log})
	}
	return r
}

// connectionIDs returns the ids of the connections this run's client holds.
func (r *serverCrashRun) connectionIDs(ctx context.Context) ([]string, error) {
	list, err := r.admin.ClientList(ctx).Result()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, line := range strings.Split(list, "\n") {
		var id, name string
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				id = v
			case "name":
				name = v
			}
		}
		if id != "" && name == r.clientName {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// crashWindow is what the subscriptions counted from the start of one
// disruption to the start of the next (or to the end of the run).
type crashWindow struct {
	name   string
	spans  int
	errors []int64  // Error log lines, per subscription
	faults []int64  // Stats().Faults, per subscription
	lines  [][2]int // the window's kept Error lines, [from, to) per subscription
}

func (r *serverCrashRun) run(disruptions []serverDisruption) {
	t := r.t
	ctx := context.Background()
	const publishers = 8
	total := r.opts.messages

	// The subscriptions record each message before acking it.
	var handlers sync.WaitGroup
	for _, s := range r.subs {
		msgs, err := s.sub.Subscribe(ctx, r.topic)
		require.NoError(t, err)
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			for m := range msgs {
				r.mu.Lock()
				byEntry := r.received[m.UUID]
				if byEntry == nil {
					byEntry = map[string]int{}
					r.received[m.UUID] = byEntry
				}
				byEntry[m.Metadata.Get(valkeystream.MetadataEntryID)]++
				r.mu.Unlock()
				m.Ack()
			}
		}()
	}

	// Publishers: calls of one to five messages until total were written.
	stop := make(chan struct{})
	var pubs sync.WaitGroup
	for p := range publishers {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			rng := rand.New(rand.NewPCG(uint64(p), uint64(time.Now().UnixNano())))
			for r.ok.Load() < int64(total) {
				select {
				case <-stop:
					return
				default:
				}
				msgs := make([]*message.Message, 1+rng.IntN(5))
				for i := range msgs {
					msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("p%d-%d", p, rng.Int())))
				}
				err := r.pub.Publish(r.topic, msgs...)
				r.mu.Lock()
				for _, m := range msgs {
					if err == nil {
						r.published[m.UUID] = true
					} else {
						r.failed[m.UUID] = true
					}
				}
				if err != nil {
					r.failedCalls++
				}
				r.mu.Unlock()
				if err != nil {
					time.Sleep(100 * time.Millisecond) // the server is down or paused
					continue
				}
				r.ok.Add(int64(len(msgs)))
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // spread the stream over a while
			}
		}()
	}
	defer func() {
		close(stop)
		pubs.Wait()
	}()

	// Each disruption fires once its share of the messages was published,
	// so that all of them land mid-stream whatever the machine's speed.
	windows := make([]crashWindow, len(disruptions))
	snapshot := func(w *crashWindow, sign int64) {
		for i, s := range r.subs {
			if w.errors == nil {
				w.errors = make([]int64, len(r.subs))
				w.faults = make([]int64, len(r.subs))
				w.lines = make([][2]int, len(r.subs))
			}
			w.lines[i][(1+sign)/2] = len(s.log.lines())
			w.errors[i] += sign * s.log.errors()
			w.faults[i] += sign * s.sub.Stats().Faults
		}
	}
	began := time.Now()
	hangBound := began.Add(3 * time.Minute)
	for i, d := range disruptions {
		threshold := int64(total) * int64(i+1) / int64(len(disruptions)+1)
		for r.ok.Load() < threshold {
			require.True(t, time.Now().Before(hangBound), "publishing stalled at %d of %d messages", r.ok.Load(), total)
			time.Sleep(5 * time.Millisecond) // the poll of a wait for the next share published
		}
		if i > 0 {
			snapshot(&windows[i-1], +1)
		}
		windows[i].name, windows[i].spans = d.name, max(d.spans, 1)
		snapshot(&windows[i], -1)
		require.NoError(t, d.do(), d.name)
	}
	pubs.Wait()
	publishedAt := time.Since(began)

	// Drain: every successful publish handled, nothing pending. The bound
	// is only against a hang.
	var missing []string
	var pending int64
	for deadline := time.Now().Add(90 * time.Second); ; {
		missing = missing[:0]
		r.mu.Lock()
		for id := range r.published {
			if len(r.received[id]) == 0 {
				missing = append(missing, id)
			}
		}
		r.mu.Unlock()
		info, err := r.admin.XPending(ctx, r.topic, r.group).Result()
		require.NoError(t, err)
		pending = info.Count
		if len(missing) == 0 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages whose Publish returned nil were never delivered (first: %v); %d entries pending; stats %s",
				len(missing), missing[:min(len(missing), 10)], pending, r.stats())
		}
		time.Sleep(50 * time.Millisecond) // the poll of a wait for every message delivered
	}
	snapshot(&windows[len(windows)-1], +1)
	t.Logf("publishing took %s, draining after it %s", publishedAt.Round(time.Millisecond), (time.Since(began) - publishedAt).Round(time.Millisecond))
	for _, s := range r.subs {
		require.NoError(t, s.sub.Close())
	}
	handlers.Wait()
	info, err := r.admin.XPending(ctx, r.topic, r.group).Result()
	require.NoError(t, err)
	require.Zero(t, info.Count, "entries pending after Close")

	r.mu.Lock()
	defer r.mu.Unlock()
	// Two kinds of duplicates: a message stored twice (go-redis retried an
	// XADD whose reply was lost), and an entry delivered twice.
	storedTwice, redelivered, failedDelivered := 0, 0, 0
	for id, byEntry := range r.received {
		if len(byEntry) > 1 {
			storedTwice++
		}
		for _, n := range byEntry {
			if n > 1 {
				redelivered++
			}
		}
		if r.failed[id] {
			failedDelivered++
		}
		require.True(t, r.published[id] || r.failed[id], "delivered message %s was never published", id)
	}
	t.Logf("%s %s: %d messages published with success, all delivered; %d publish calls failed (%d messages, %d of them written anyway and delivered); duplicates: %d messages stored twice by a retried write, %d entries delivered more than once",
		r.srv.Name(), r.srv.Version(), len(r.published), r.failedCalls, len(r.failed), failedDelivered, storedTwice, redelivered)
	for _, w := range windows {
		t.Logf("%-45s error log lines per subscription %v, failed calls %v", w.name+":", w.errors, w.faults)
		for i, s := range r.subs {
			assert.LessOrEqual(t, w.errors[i], int64(w.spans*maxErrorLinesPerDisruption),
				"%s: subscription %s logged too many errors; its lines in this window:\n%s", w.name, s.consumer, strings.Join(s.log.lines()[w.lines[i][0]:w.lines[i][1]], "\n"))
			assert.LessOrEqual(t, w.faults[i], int64(w.spans*maxFaultsPerDisruption),
				"%s: subscription %s failed too many calls: a loop must back off", w.name, s.consumer)
		}
	}
	t.Logf("stats %s", r.stats())
}

func (r *serverCrashRun) stats() string {
	var b strings.Builder
	for _, s := range r.subs {
		fmt.Fprintf(&b, "%s %+v ", s.consumer, s.sub.Stats())
	}
	return b.String()
}
