package valkeystream_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

var _ middleware.ExpiringKeyRepository = (*valkeystream.ExpiringKeyRepository)(nil)

func (e *env) deduplicator(edit ...func(*valkeystream.DedupConfig)) *valkeystream.Deduplicator {
	e.t.Helper()
	cfg := valkeystream.DedupConfig{Client: e.client}
	for _, f := range edit {
		f(&cfg)
	}
	d, err := valkeystream.NewDeduplicator(cfg, testLogger())
	require.NoError(e.t, err)
	return d
}

// markKey is the key of the default-namespace mark of uuid delivered from
// e.topic through group.
func (e *env) markKey(group, uuid string) string {
	return valkeystream.DefaultDedupKeyPrefix + e.topic + ":" + group + ":" + uuid
}

// delivered returns a message as a Subscriber of e.topic and group would
// deliver it, for driving the middleware without a subscription.
func (e *env) delivered(group, uuid string) *message.Message {
	msg := message.NewMessage(uuid, []byte("x"))
	msg.Metadata.Set(valkeystream.MetadataStream, e.topic)
	msg.Metadata.Set(valkeystream.MetadataGroup, group)
	return msg
}

func TestDedupConfigValidate(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	for _, tc := range []struct {
		name  string
		cfg   valkeystream.DedupConfig
		field string
	}{
		{"no client", valkeystream.DedupConfig{}, "DedupConfig.Client"},
		{"window", valkeystream.DedupConfig{Client: client, Window: time.Microsecond}, "DedupConfig.Window"},
		{"running ttl", valkeystream.DedupConfig{Client: client, RunningTTL: time.Millisecond}, "DedupConfig.RunningTTL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := valkeystream.NewDeduplicator(tc.cfg, nil)
			if !errors.Is(err, valkeystream.ErrInvalidConfig) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidConfig", err)
			}
			assert.Contains(t, err.Error(), tc.field)
		})
	}
	_, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: client}, nil)
	assert.NoError(t, err, "defaults are valid")

	_, err = valkeystream.NewExpiringKeyRepository(valkeystream.ExpiringKeyRepositoryConfig{})
	assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
	assert.ErrorContains(t, err, "ExpiringKeyRepositoryConfig.Client")
}

// A handler that fails once and then succeeds runs twice and is marked done
// once; a later duplicate of it is Acked without the handler.
func TestDedupFailureThenSuccessRunsTwiceMarkedOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	d := e.deduplicator()
	var calls atomic.Int32
	handled := make(chan struct{}, 10)
	e.runRouter(e.subscriber("g", "c", fastRedelivery), func(msg *message.Message) error {
		n := calls.Add(1)
		handled <- struct{}{}
		if n == 1 {
			return errors.New("first try fails")
		}
		return nil
	}, d.Middleware)

	msg := e.publish(1)[0]
	waitUntil(t, "the message is Acked", func() bool { return calls.Load() >= 2 && e.pendingCount(e.topic, "g") == 0 })
	if got := calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2", got)
	}
	got := d.Stats()
	want := valkeystream.DedupStats{Handled: 2, Marked: 1, Released: 1}
	if got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
	key := e.markKey("g", msg.UUID)
	assert.Equal(t, "done", e.client.Get(context.Background(), key).Val())
	ttl := e.client.PTTL(context.Background(), key).Val()
	if ttl <= 0 || ttl > valkeystream.DefaultDedupWindow {
		t.Fatalf("done mark's time to live is %s, want in (0, %s]", ttl, valkeystream.DefaultDedupWindow)
	}

	// The same UUID published again is a duplicate of a done message.
	pub := e.publisher()
	require.NoError(t, pub.Publish(e.topic, message.NewMessage(msg.UUID, []byte("again"))))
	waitUntil(t, "the duplicate is skipped", func() bool { return d.Stats().Skipped == 1 })
	waitUntil(t, "the duplicate is Acked", func() bool { return e.pendingCount(e.topic, "g") == 0 })
	if got := calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times after the duplicate, want 2", got)
	}
}

// Two deliveries of one UUID at the same time, to two routers on one group,
// run the handler once: the second waits for the first and is Acked as a
// duplicate.
func TestDedupConcurrentDeliveriesRunTheHandlerOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	var arrived, ran atomic.Int32
	bothArrived := make(chan struct{})
	var closeOnce sync.Once
	// arrive counts deliveries that reached the router, before the
	// deduplicator sees them.
	arrive := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if arrived.Add(1) == 2 {
				closeOnce.Do(func() { close(bothArrived) })
			}
			return h(msg)
		}
	}
	handler := func(msg *message.Message) error {
		ran.Add(1)
		select {
		case <-bothArrived: // the other delivery is waiting on our mark
		case <-time.After(receiveTimeout):
			t.Errorf("the second delivery did not arrive while the first was handled")
		}
		return nil
	}
	dA := e.deduplicator(func(c *valkeystream.DedupConfig) { c.BusyWait = receiveTimeout })
	dB := e.deduplicator(func(c *valkeystream.DedupConfig) { c.BusyWait = receiveTimeout })
	oneAtATime := func(c *valkeystream.SubscriberConfig) { fastRedelivery(c); c.BatchSize = 1 }
	e.runRouter(e.subscriber("g", "a", oneAtATime), handler, arrive, dA.Middleware)
	e.runRouter(e.subscriber("g", "b", oneAtATime), handler, arrive, dB.Middleware)

	uuid := watermill.NewUUID()
	pub := e.publisher()
	require.NoError(t, pub.Publish(e.topic, message.NewMessage(uuid, []byte("1")), message.NewMessage(uuid, []byte("2"))))

	waitUntil(t, "both copies are Acked", func() bool {
		return arrived.Load() == 2 && e.pendingCount(e.topic, "g") == 0 && dA.Stats().Skipped+dB.Stats().Skipped == 1
	})
	if got := ran.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	a, b := dA.Stats(), dB.Stats()
	if a.Handled+b.Handled != 1 || a.Marked+b.Marked != 1 {
		t.Fatalf("handled %d, marked %d across both; want 1 and 1 (stats %+v, %+v)",
			a.Handled+b.Handled, a.Marked+b.Marked, a, b)
	}
}

// With BusyWait negative, a delivery that finds the message in progress is
// Nacked at once with ErrDuplicateInProgress.
func TestDedupBusyDeliveryIsNacked(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	d := e.deduplicator(func(c *valkeystream.DedupConfig) { c.BusyWait = -1 })
	msg := e.delivered("g", watermill.NewUUID())
	key := e.markKey("g", msg.UUID)
	require.NoError(t, e.client.Set(context.Background(), key, "running:other", time.Minute).Err())

	called := false
	_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		called = true
		return nil, nil
	})(msg)
	if !errors.Is(err, valkeystream.ErrDuplicateInProgress) {
		t.Fatalf("got %v, want ErrDuplicateInProgress", err)
	}
	assert.False(t, called, "handler called while another handling holds the mark")
	assert.Equal(t, "running:other", e.client.Get(context.Background(), key).Val(), "the other handling's mark was touched")
	assert.Equal(t, int64(1), d.Stats().Busy)
}

// A handler that outlives RunningTTL keeps its mark by renewal; when its
// process stops renewing (here: its client is closed, as if it died), the
// mark expires within RunningTTL and a redelivery runs.
func TestDedupInProgressMarkIsRenewedAndExpiresWhenItsOwnerDies(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	// Renewed every third of it: a stall of the test process up to 2/3 of
	// it is harmless. A longer stall lets the mark lapse, as it should for
	// an owner that stalls; 2 s covers the stalls of a CI pass beside other
	// work (1 s did not, at a load average of 26 on 2 cores).
	const ttl = 2 * time.Second
	dyingClient := redis.NewClient(&redis.Options{Addr: e.srv.Addr()})
	t.Cleanup(func() { _ = dyingClient.Close() })
	dying := e.deduplicator(func(c *valkeystream.DedupConfig) { c.Client = dyingClient; c.RunningTTL = ttl })
	peer := e.deduplicator(func(c *valkeystream.DedupConfig) { c.RunningTTL = ttl; c.BusyWait = -1 })

	uuid := watermill.NewUUID()
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = dying.Middleware(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-release
			return nil, nil
		})(e.delivered("g", uuid))
	}()
	t.Cleanup(func() { close(release) })
	<-started

	var peerRuns atomic.Int32
	peerHandler := peer.Middleware(func(*message.Message) ([]*message.Message, error) {
		peerRuns.Add(1)
		return nil, nil
	})
	// Two lifetimes of the mark pass while the handler runs: renewal keeps
	// it, so the peer is turned away each time.
	for range 4 {
		_, err := peerHandler(e.delivered("g", uuid))
		if !errors.Is(err, valkeystream.ErrDuplicateInProgress) {
			t.Fatalf("peer delivery while the handler runs: got %v, want ErrDuplicateInProgress", err)
		}
		time.Sleep(ttl / 2) // the time is the scenario: the mark's lifetimes pass
	}
	// The mark still holds the renewed time to live.
	if left := e.client.PTTL(context.Background(), e.markKey("g", uuid)).Val(); left <= 0 {
		t.Fatalf("in-progress mark's time to live is %s, want positive", left)
	}

	require.NoError(t, dyingClient.Close()) // no more renewals
	waitUntil(t, "the peer runs the message", func() bool {
		_, err := peerHandler(e.delivered("g", uuid))
		return err == nil && peerRuns.Load() == 1
	})
	assert.Equal(t, "done", e.client.Get(context.Background(), e.markKey("g", uuid)).Val())
}

// Marks are per consumer group: two groups each handle the message, and a
// fan-out delivery without a Namespace is refused with an error naming it.
func TestDedupNamespaces(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	d := e.deduplicator()
	uuid := watermill.NewUUID()
	runs := 0
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
	for _, group := range []string{"g1", "g2", "g1"} {
		_, err := h(e.delivered(group, uuid))
		require.NoError(t, err)
	}
	if runs != 2 {
		t.Fatalf("handler ran %d times for groups g1, g2, g1; want 2", runs)
	}

	fanOut := message.NewMessage(uuid, nil)
	_, err := h(fanOut)
	assert.ErrorContains(t, err, "DedupConfig.Namespace")

	named := e.deduplicator(func(c *valkeystream.DedupConfig) { c.Namespace = "reader-1" })
	_, err = named.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })(fanOut)
	require.NoError(t, err)
	assert.Equal(t, "done", e.client.Get(context.Background(), valkeystream.DefaultDedupKeyPrefix+"reader-1:"+uuid).Val())
}

// Watermill's Deduplicator with the server-side repository drops a repeat
// across two routers' worth of middleware, and every key has a time to live.
func TestExpiringKeyRepository(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	repo, err := valkeystream.NewExpiringKeyRepository(valkeystream.ExpiringKeyRepositoryConfig{Client: e.client, Window: time.Minute})
	require.NoError(t, err)

	var mu sync.Mutex
	var got []string
	h := func(msg *message.Message) ([]*message.Message, error) {
		mu.Lock()
		got = append(got, string(msg.Payload))
		mu.Unlock()
		return nil, nil
	}
	// Two deduplicators stand for two processes sharing the repository.
	// Watermill's Deduplicator raises a Timeout under 5 ms to 5 ms, which a
	// loaded machine exceeds: a minute, as NewDeduplicator gives.
	first := (&middleware.Deduplicator{KeyFactory: middleware.NewMessageHasherFromMetadataField("id"), Repository: repo, Timeout: time.Minute}).Middleware(h)
	second := (&middleware.Deduplicator{KeyFactory: middleware.NewMessageHasherFromMetadataField("id"), Repository: repo, Timeout: time.Minute}).Middleware(h)
	for i, m := range []struct{ id, payload string }{{"k1", "a"}, {"k1", "b"}, {"k2", "c"}} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(m.payload))
		msg.Metadata.Set("id", m.id)
		_, err := []message.HandlerFunc{first, second}[i%2](msg)
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"a", "c"}, got)

	ttl := e.client.PTTL(context.Background(), valkeystream.DefaultDedupKeyPrefix+"k1").Val()
	if ttl <= 0 || ttl > time.Minute {
		t.Fatalf("key time to live is %s, want in (0, 1m]", ttl)
	}
}

// BenchmarkConsumeRouterDedup measures b.N pre-published messages handled
// through a Watermill router by a handler that does nothing, without and
// with the Deduplicator (two more round trips per message: SET NX before the
// handler, the done mark after it).
func BenchmarkConsumeRouterDedup(b *testing.B) {
	srv := testserver.Start(b)
	client := newClient(b, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	require.NoError(b, err)
	for _, withDedup := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "dedup"}[withDedup], func(b *testing.B) {
			sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
				Client: client, ConsumerGroup: "bench", Start: valkeystream.StartHead,
			}, nil)
			require.NoError(b, err)
			topic := prefill(b, pub, b.N)
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(b, err)
			done := make(chan struct{})
			handled := 0
			h := router.AddNoPublisherHandler("bench", topic, sub, func(*message.Message) error {
				handled++ // the subscription delivers one message at a time
				if handled == b.N {
					close(done)
				}
				return nil
			})
			if withDedup {
				d, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: client}, nil)
				require.NoError(b, err)
				h.AddMiddleware(d.Middleware)
			}
			b.ReportAllocs()
			b.ResetTimer()
			go func() { _ = router.Run(context.Background()) }()
			<-done
			b.StopTimer()
			require.NoError(b, router.Close())
		})
	}
}

// failFirstPublish fails its first Publish call and passes the others on.
type failFirstPublish struct {
	message.Publisher
	calls atomic.Int32
}

func (p *failFirstPublish) Publish(topic string, msgs ...*message.Message) error {
	if p.calls.Add(1) == 1 {
		return errors.New("publishing the produced messages failed")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// A handler's produced messages are published by the router after the
// middleware returns; when that fails, the router Nacks the message. The
// redelivery must run the handler again, or the produced messages are lost.
func TestDedupProducedMessagesSurviveAFailedPublish(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	d := e.deduplicator()
	out := e.topic + "-out"
	pub := &failFirstPublish{Publisher: e.publisher()}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: receiveTimeout}, testLogger())
	require.NoError(t, err)
	var runs atomic.Int32
	router.AddHandler("produce", e.topic, e.subscriber("g", "c", fastRedelivery), out, pub,
		func(msg *message.Message) ([]*message.Message, error) {
			runs.Add(1)
			return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
		}).AddMiddleware(d.Middleware)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	})
	<-router.Running()

	msg := e.publish(1)[0]
	waitUntil(t, "the produced message is published, the input Acked and marked done", func() bool {
		return e.client.XLen(context.Background(), out).Val() == 1 && e.pendingCount(e.topic, "g") == 0 &&
			d.Stats().Marked == 1
	})
	if got := runs.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2 (the first run's output was not published)", got)
	}
	assert.Equal(t, "done", e.client.Get(context.Background(), e.markKey("g", msg.UUID)).Val())
	got := d.Stats()
	if got.Handled != 2 || got.Marked != 1 || got.Released != 1 || got.Skipped != 0 {
		t.Fatalf("stats %+v, want Handled 2, Marked 1, Released 1, Skipped 0", got)
	}
}
