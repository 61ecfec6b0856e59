package valkeystream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// Handlers' verdicts (RetryAfter, NackAfter, GiveUp, Reject) against a real
// server: what the server keeps pending, the counts it grows, the idle time
// of what is handed back, the dead letters. The loop's decisions are tested
// against a fake in internal/loop/later_test.go.

// pendingOf returns the pending entry of the message with uuid in e's
// topic for group, failing the test if there is none.
func (e *env) pendingOf(group, entryID string) redis.XPendingExt {
	e.t.Helper()
	for _, p := range e.pending(group) {
		if p.ID == entryID {
			return p
		}
	}
	e.t.Fatalf("entry %s is not pending in group %s", entryID, group)
	return redis.XPendingExt{}
}

// A message a router handler asks to retry later does not hold the others
// up; while it waits (three times ClaimMinIdle here), the hold keeps it
// from the subscription's own claims, so it is not delivered again. When
// the router closes, it is handed back with the idle time of its due time
// (due in an hour, later than ClaimMinIdle: idle 0), its count unchanged,
// and a peer takes it after ClaimMinIdle with its count grown.
func TestRetryAfterInARouterLetsTheOthersFlowOn(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(3)

	var mu sync.Mutex
	var order []string
	sub := e.subscriber("g", "worker", shortClaim)
	stop := e.runRouter(sub, func(msg *message.Message) error {
		mu.Lock()
		order = append(order, msg.UUID)
		mu.Unlock()
		if msg.UUID == sent[0].UUID {
			return valkeystream.RetryAfter(msg, time.Hour, errors.New("rate limited"))
		}
		return nil
	})
	waitUntil(t, "the two others handled and acknowledged", func() bool {
		return e.pendingCount(e.topic, "g") == 1 && sub.Stats().Nacks.Deferred == 1
	})
	entryID := e.pending("g")[0].ID
	// Three times ClaimMinIdle: without the hold, the subscription's own
	// claim would take it back.
	time.Sleep(900 * time.Millisecond)
	mu.Lock()
	got := append([]string(nil), order...)
	mu.Unlock()
	assert.Equal(t, []string{sent[0].UUID, sent[1].UUID, sent[2].UUID}, got, "the deferred message is delivered once, the others after it")
	assert.EqualValues(t, 1, sub.Stats().Nacks.RetriesLater)
	assert.EqualValues(t, 1, e.pendingOf("g", entryID).RetryCount, "waiting grows no count")

	stop()
	p := e.pendingOf("g", entryID)
	assert.EqualValues(t, 1, p.RetryCount, "handing back grows no count")
	assert.Less(t, p.Idle, 300*time.Millisecond, "due later than ClaimMinIdle: handed back idle 0, taken after ClaimMinIdle")
	assert.EqualValues(t, 0, sub.Stats().Nacks.Deferred)

	peer := e.subscribe(e.subscriber("g", "peer", shortClaim))
	m := receive(t, peer)
	assert.Equal(t, sent[0].UUID, m.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(m))
	m.Ack()
	waitUntil(t, "nothing pending", func() bool { return e.pendingCount(e.topic, "g") == 0 })
}

// A message Nacked with NackAfter on a plain channel comes back after its
// delay (never before: the loop's clock), with the count the server grew.
func TestNackAfterOnAChannelComesBackWhenDue(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(1)
	sub := e.subscriber("g", "worker", fastRedelivery)
	msgs := e.subscribe(sub)

	m := receive(t, msgs)
	const after = 200 * time.Millisecond
	nacked := time.Now()
	require.True(t, valkeystream.NackAfter(m, after))
	again := receive(t, msgs)
	assert.GreaterOrEqual(t, time.Since(nacked), after, "came back before its delay")
	assert.Equal(t, sent[0].UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	assert.Empty(t, again.Metadata.Get(valkeystream.MetadataRetryAfter), "the verdict of the last delivery is not carried over")
	again.Ack()
	waitUntil(t, "nothing pending", func() bool { return e.pendingCount(e.topic, "g") == 0 })
	st := sub.Stats()
	assert.EqualValues(t, 1, st.Nacks.RetriesLater)
	assert.EqualValues(t, 0, st.Nacks.Waits, "a retry later waits its own delay, not the Nack backoff")
}

// A subscription that ends hands a deferred entry back with the idle time
// that makes a peer's claim take it when it is due: due in 20 s with
// ClaimMinIdle 30 s, it is handed back idle 10 s. (XCLAIM ... TIME in the
// future is clamped to now by the server, so IDLE it is.)
func TestAClosedSubscriptionHandsDeferredEntriesBackForWhenTheyAreDue(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	sub := e.subscriber("g", "worker", fastRedelivery) // ClaimMinIdle: the default, 30 s
	msgs := e.subscribe(sub)
	m := receive(t, msgs)
	entryID := m.Metadata.Get(valkeystream.MetadataEntryID)
	valkeystream.NackAfter(m, 20*time.Second)
	waitUntil(t, "deferred", func() bool { return sub.Stats().Nacks.Deferred == 1 })
	require.NoError(t, sub.Close())

	p := e.pendingOf("g", entryID)
	assert.GreaterOrEqual(t, p.Idle, 10*time.Second)
	assert.Less(t, p.Idle, 30*time.Second, "a peer would take it before it is due")
	assert.EqualValues(t, 1, p.RetryCount)
	assert.Equal(t, "worker", p.Consumer)
}

// A router handler that gives up makes exactly one dead letter, with its
// reason, in the topic's dead-letter stream, and leaves nothing pending;
// the handler is not called again.
func TestGiveUpInARouterDeadLettersOnceWithTheReason(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := message.NewMessage("order-7", []byte("order 7"))
	sent.Metadata.Set("trace", "abc")
	require.NoError(t, e.publisher().Publish(e.topic, sent))

	var seen deliveries
	sub := e.subscriber("g", "worker", fastRedelivery)
	e.runRouter(sub, func(msg *message.Message) error {
		seen.record(msg)
		return valkeystream.GiveUp(msg, errors.New("card declined"))
	})
	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	waitUntil(t, "dead-lettered and acknowledged", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	original, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	dead := e.stored(deadKey)[0]
	assert.Equal(t, sent.UUID, dead.UUID)
	assert.Equal(t, "order 7", string(dead.Payload))
	for key, want := range map[string]string{
		"trace":                                    "abc",
		valkeystream.MetadataError:                 "card declined",
		valkeystream.MetadataOriginalTopic:         e.topic,
		valkeystream.MetadataOriginalStream:        e.topic,
		valkeystream.MetadataOriginalEntryID:       original[0].ID,
		valkeystream.MetadataOriginalGroup:         "g",
		valkeystream.MetadataOriginalConsumer:      "worker",
		valkeystream.MetadataOriginalDeliveryCount: "1",
	} {
		assert.Equal(t, want, dead.Metadata.Get(key), "metadata %s", key)
	}
	for _, key := range []string{valkeystream.MetadataGiveUp, valkeystream.MetadataDeliveryCount, valkeystream.MetadataEntryID} {
		assert.NotContains(t, dead.Metadata, key)
	}
	expectNothingFor(t, 200*time.Millisecond, func() bool { return seen.calls() > 1 || len(e.stored(deadKey)) > 1 })
	assert.Equal(t, []int{1}, seen.of(sent.UUID))
	assert.EqualValues(t, 1, sub.Stats().Nacks.GivenUp)
}

// expectNothingFor fails if happened holds within d.
func expectNothingFor(t *testing.T, d time.Duration, happened func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if happened() {
			t.Fatal("it happened")
		}
	}
}

// GiveUp inside the DeadLetter middleware, with middleware.Retry told not to
// retry verdicts (IsFinal): one dead letter, the middleware's, with the
// reason; the handler runs once; nothing pending, and the Subscriber sees an
// Ack.
func TestGiveUpInsideTheDeadLetterMiddlewareMakesOneDeadLetter(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	var seen deliveries
	retry := middleware.Retry{
		MaxRetries:  3,
		ShouldRetry: func(p middleware.RetryParams) bool { return !valkeystream.IsFinal(p.Err) },
	}
	sub := e.subscriber("g", "worker", fastRedelivery)
	e.runRouter(sub, func(msg *message.Message) error {
		seen.record(msg)
		return valkeystream.GiveUp(msg, errors.New("card declined"))
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 5}), retry.Middleware)

	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	waitUntil(t, "dead-lettered and acknowledged", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	expectNothingFor(t, 200*time.Millisecond, func() bool { return len(e.stored(deadKey)) > 1 })
	dead := e.stored(deadKey)[0]
	assert.Equal(t, "card declined", dead.Metadata.Get(valkeystream.MetadataError))
	assert.NotContains(t, dead.Metadata, valkeystream.MetadataGiveUp)
	assert.Equal(t, 1, seen.calls(), "Retry with IsFinal does not call the handler again")
	st := sub.Stats()
	assert.EqualValues(t, 0, st.Nacks.GivenUp, "the middleware gave it up; the Subscriber saw an Ack")
	assert.EqualValues(t, 0, st.Nacks.Nacked)
}

// Reject on a plain channel: one dead letter with the reason, nothing
// pending; with NoDeadLetter, nothing written and nothing pending.
func TestRejectOnAChannel(t *testing.T) {
	testserver.Parallel(t)
	for _, noDead := range []bool{false, true} {
		t.Run(map[bool]string{false: "dead letter", true: "NoDeadLetter"}[noDead], func(t *testing.T) {
			e := newEnv(t)
			e.publish(2)
			sub := e.subscriber("g", "worker", fastRedelivery, func(c *valkeystream.SubscriberConfig) {
				if noDead {
					c.DeadLetterSuffix = valkeystream.NoDeadLetter
				}
			})
			msgs := e.subscribe(sub)
			m := receive(t, msgs)
			require.True(t, valkeystream.Reject(m, errors.New("malformed order")))
			receive(t, msgs).Ack()
			waitUntil(t, "nothing pending", func() bool { return e.pendingCount(e.topic, "g") == 0 })
			deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
			dead := e.stored(deadKey)
			if noDead {
				assert.Empty(t, dead)
			} else {
				require.Len(t, dead, 1)
				assert.Equal(t, m.UUID, dead[0].UUID)
				assert.Equal(t, "malformed order", dead[0].Metadata.Get(valkeystream.MetadataError))
			}
			assert.EqualValues(t, 1, sub.Stats().Nacks.GivenUp)
		})
	}
}

// A give-up whose copy fails (the dead-letter key holds a string) leaves
// the entry pending and unacknowledged, not delivered again at once; it
// comes back through the subscription's claim after ClaimMinIdle, and once
// the key is free its dead letter is written.
func TestAGiveUpWhoseCopyFailsStaysPending(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	ctx := context.Background()
	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	require.NoError(t, e.client.Set(ctx, deadKey, "not a stream", 0).Err())

	sub := e.subscriber("g", "worker", shortClaim)
	msgs := e.subscribe(sub)
	m := receive(t, msgs)
	valkeystream.Reject(m, errors.New("malformed order"))
	waitUntil(t, "the failed copy counted", func() bool { return sub.Stats().Faults > 0 })
	assert.EqualValues(t, 1, e.pendingCount(e.topic, "g"), "a failed copy leaves it pending")
	assert.EqualValues(t, 0, sub.Stats().Nacks.GivenUp)

	require.NoError(t, e.client.Del(ctx, deadKey).Err())
	again := receive(t, msgs) // reclaimed after ClaimMinIdle
	assert.Equal(t, m.UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	valkeystream.Reject(again, errors.New("malformed order"))
	waitUntil(t, "dead-lettered and acknowledged", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	assert.EqualValues(t, 1, sub.Stats().Nacks.GivenUp)
}
