package valkeystream_test

import (
	"context"
	"strings"
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

func TestDeliveryMetadata(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := message.NewMessage(watermill.NewUUID(), []byte("body"))
	sent.Metadata.Set("trace", "abc")
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, sent))

	msgs := e.subscribe(e.subscriber("g", "worker-1"))
	got := receive(t, msgs)
	got.Ack()

	entries, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, sent.UUID, got.UUID, "the UUID is the stored id, not the stream position")
	assert.NotEqual(t, entries[0].ID, got.UUID)
	assert.Equal(t, "body", string(got.Payload))
	assert.Equal(t, "abc", got.Metadata.Get("trace"))
	assert.Equal(t, 1, valkeystream.DeliveryCount(got))
	assert.Equal(t, entries[0].ID, got.Metadata.Get(valkeystream.MetadataEntryID))
	assert.Equal(t, e.topic, got.Metadata.Get(valkeystream.MetadataStream))
	assert.Equal(t, "g", got.Metadata.Get(valkeystream.MetadataGroup))
	assert.Equal(t, "worker-1", got.Metadata.Get(valkeystream.MetadataConsumer))
}

func TestNackRedeliversWithGrowingCountBeforeNewerEntries(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c", fullBatches)
	msgs := e.subscribe(sub)
	sent := e.publishAtOnce(2)

	for want := 1; want <= 3; want++ {
		m := receive(t, msgs)
		require.Equal(t, sent[0].UUID, m.UUID, "a nacked message must come back before newer ones")
		require.Equal(t, want, valkeystream.DeliveryCount(m))
		m.Nack()
	}
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)
	assert.Equal(t, 4, valkeystream.DeliveryCount(m))
	p := e.pending("g")
	require.Len(t, p, 2, "both entries are pending while the first is handled")
	assert.Equal(t, int64(4), p[0].RetryCount, "the metadata count is the server's count")
	m.Ack()

	m = receive(t, msgs)
	assert.Equal(t, sent[1].UUID, m.UUID)
	assert.Equal(t, 1, valkeystream.DeliveryCount(m))
	m.Ack()

	require.NoError(t, sub.Close())
	assert.Empty(t, e.pending("g"), "Close must flush every Ack")
	assert.Equal(t, int64(3), sub.Stats().Nacks.Nacked)
}

func TestNackResendDelay(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	msgs := e.subscribe(e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.NackResendDelay = 300 * time.Millisecond
	}))
	m := receive(t, msgs)
	nackedAt := time.Now()
	m.Nack()
	again := receive(t, msgs)
	assert.GreaterOrEqual(t, time.Since(nackedAt), 300*time.Millisecond, "a delay is a lower bound")
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()
}

func TestNackLeavesAnEntryThatAnotherConsumerTookOver(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	e.publish(1)
	client, scripts := e.commandCounter("evalsha")
	msgs := e.subscribe(e.subscriber("g", "c", onClient(client)))
	m := receive(t, msgs)
	id := m.Metadata.Get(valkeystream.MetadataEntryID)
	require.NoError(t, e.client.XClaim(ctx, &redis.XClaimArgs{
		Stream: e.topic, Group: "g", Consumer: "other", Messages: []string{id}}).Err())
	before := scripts.Load()
	m.Nack()
	// The only script the loop runs here is the Nack claim (hold beats come
	// every ClaimMinIdle/3 = 10 s).
	waitUntil(t, "the Nack claim ran", func() bool { return scripts.Load() > before })
	expectNothing(t, msgs, 100*time.Millisecond)
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "other", p[0].Consumer, "a Nack must not take the entry back from its new holder")
}

func TestAcksAreSentDuringNackResendDelay(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(2)
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.NackResendDelay = 4 * time.Second
		// Long enough that the Ack is still waiting when the Nack comes.
		c.AckFlushInterval = time.Second
	})
	msgs := e.subscribe(sub)
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)
	m.Ack()
	m = receive(t, msgs)
	require.Equal(t, sent[1].UUID, m.UUID)
	m.Nack()
	// Well before the delay ends, the first Ack has reached the server.
	require.Eventually(t, func() bool { return len(e.pending("g")) == 1 }, 3*time.Second, 20*time.Millisecond,
		"an Ack must not wait for another message's NackResendDelay")
	again := receive(t, msgs)
	assert.Equal(t, sent[1].UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()
}

func TestMessageContextEndsWhenSettled(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	m := receive(t, e.subscribe(e.subscriber("g", "c")))
	require.NoError(t, m.Context().Err())
	m.Ack()
	select {
	case <-m.Context().Done():
	case <-time.After(receiveTimeout):
		t.Fatal("the message context was not cancelled after Ack")
	}
}

// With AckAtOnce each Ack reaches the server before the next message is
// handed over, though the loop holds the rest of its batch.
func TestAcksAtOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	msgs := e.subscribe(e.subscriber("g", "c", fullBatches, func(c *valkeystream.SubscriberConfig) {
		c.AckFlushInterval = valkeystream.AckAtOnce
		c.ClaimMinIdle = time.Hour // no hold beat sends the Acks
	}))
	e.publishAtOnce(3)
	for i := range 3 {
		m := receive(t, msgs)
		// Batched Acks would be sent only after the next hand-over.
		require.Len(t, e.pending("g"), 3-i, "pending entries when message %d is handed over", i)
		m.Ack()
	}
	waitUntil(t, "the last Ack is on the server", func() bool { return len(e.pending("g")) == 0 })
}

// infoCounter counts the Info lines whose message contains substr and passes
// every line on to the test logger.
type infoCounter struct {
	watermill.LoggerAdapter
	substr string
	n      *atomic.Int64
}

func (l infoCounter) Info(msg string, fields watermill.LogFields) {
	if strings.Contains(msg, l.substr) {
		l.n.Add(1)
	}
	l.LoggerAdapter.Info(msg, fields)
}

func (l infoCounter) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return infoCounter{LoggerAdapter: l.LoggerAdapter.With(fields), substr: l.substr, n: l.n}
}

// With the defaults, a handler that always fails does not spin: the wait
// before each redelivery doubles from DefaultNackBackoffMin with the
// server's delivery count, and the Nacks are logged at a bounded rate.
func TestAlwaysFailingHandlerBacksOffByDefault(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	logged := infoCounter{LoggerAdapter: testLogger(), substr: "nacked", n: new(atomic.Int64)}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: e.client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartHead,
	}, logged)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs := e.subscribe(sub)

	const deliveries = 20
	var at []time.Time
	for i := 1; i <= deliveries; i++ {
		m := receive(t, msgs)
		at = append(at, time.Now())
		require.Equal(t, i, valkeystream.DeliveryCount(m))
		m.Nack()
	}
	for i := 1; i < deliveries; i++ {
		// Waits only grow on a loaded machine, so a lower bound holds.
		// The first failure is retried at once; then the wait doubles.
		want := time.Duration(0)
		if i > 1 {
			want = min(valkeystream.DefaultNackBackoffMin<<(i-2), valkeystream.DefaultNackBackoffMax)
		}
		assert.GreaterOrEqual(t, at[i].Sub(at[i-1]), want, "wait before delivery %d", i+1)
	}
	elapsed := at[deliveries-1].Sub(at[0])
	rate := float64(deliveries-1) / elapsed.Seconds()
	assert.Less(t, rate, 20.0, "redeliveries per second")
	t.Logf("%d redeliveries in %s (%.1f/s)", deliveries-1, elapsed, rate)
	// One Info line per 10 s at most: here, the first Nack's.
	assert.Equal(t, int64(1), logged.n.Load(), "Nacks logged at Info level")
}

// Stats' gauges show what XINFO cannot: how many of the entries pending for
// this consumer wait in its queue, and which one a handler has.
func TestStatsGaugesReadAheadAndInFlight(t *testing.T) {
	testserver.Parallel(t)
	for _, group := range []string{"g", ""} {
		t.Run("group="+group, func(t *testing.T) {
			e := newEnv(t)
			sub := e.subscriber(group, "c", fullBatches, func(c *valkeystream.SubscriberConfig) { c.BatchSize = 10 })
			msgs := e.subscribe(sub)
			e.publishAtOnce(10)
			m := receive(t, msgs)
			gauges := func() [2]int64 { s := sub.Stats(); return [2]int64{s.ReadAhead, s.InFlight} }
			waitUntil(t, "9 read ahead and 1 in flight", func() bool { return gauges() == [2]int64{9, 1} })
			if group != "" {
				assert.Len(t, e.pending(group), 10, "the server sees all ten as delivered")
			}
			m.Ack()
			receiveAll(t, msgs, 9)
			waitUntil(t, "nothing read ahead or in flight", func() bool { return gauges() == [2]int64{0, 0} })
			e.publish(1)
			receive(t, msgs) // left in the handler's hands
			waitUntil(t, "1 in flight", func() bool { return gauges() == [2]int64{0, 1} })
			require.NoError(t, sub.Close())
			assert.Equal(t, [2]int64{0, 0}, gauges(), "a closed subscription holds nothing")
		})
	}
}
