package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func (e *env) exactlyOnce(pub *valkeystream.Publisher, edit ...func(*valkeystream.ExactlyOnceConfig)) *valkeystream.ExactlyOnce {
	e.t.Helper()
	cfg := valkeystream.ExactlyOnceConfig{Publisher: pub}
	for _, f := range edit {
		f(&cfg)
	}
	x, err := valkeystream.NewExactlyOnce(cfg, testLogger())
	require.NoError(e.t, err)
	return x
}

// runTransform runs a router handler from e.topic to out under mw (the
// first outermost), publishing through pub.
func (e *env) runTransform(sub message.Subscriber, pub message.Publisher, out string, h message.HandlerFunc, mw ...message.HandlerMiddleware) (stop func()) {
	e.t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: receiveTimeout}, testLogger())
	require.NoError(e.t, err)
	router.AddHandler("transform", e.topic, sub, out, pub, h).AddMiddleware(mw...)
	return e.startRouter(router)
}

// outputOf is the transform of the tests: one output per input, with the
// input's UUID in its metadata.
func outputOf(msg *message.Message) *message.Message {
	out := message.NewMessage(watermill.NewUUID(), append([]byte("out:"), msg.Payload...))
	out.Metadata.Set("input", msg.UUID)
	return out
}

// inputsOf counts the outputs in stream key per input UUID.
func (e *env) inputsOf(key string) map[string]int {
	e.t.Helper()
	n := map[string]int{}
	for _, m := range e.stored(key) {
		n[m.Metadata.Get("input")]++
	}
	return n
}

func TestExactlyOnceWritesReturnedMessagesWithTheAck(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	out := e.topic + "-out"
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	e.runTransform(sub, pub, out, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputOf(msg), outputOf(msg)}, nil
	}, x.Middleware)
	// Counted once the shared reader has started: each of its interrupts
	// is a transaction with an XACK that acknowledges nothing (see
	// internal/sharedread), counted apart.
	waitUntil(t, "the shared read blocks", func() bool { return e.blockedReads() == 1 })
	before := e.serverCallsOf("xack", "exec")
	in := e.publish(20)
	// Outputs is counted just after Committed: both are waited for.
	waitUntil(t, "every input acknowledged", func() bool { return x.Stats().Committed == 20 && x.Stats().Outputs == 40 })
	got := e.inputsOf(out)
	for _, m := range in {
		assert.Equal(t, 2, got[m.UUID], "outputs of %s", m.UUID)
	}
	assert.Len(t, got, 20)
	assert.Zero(t, e.pendingCount(e.topic, "g"))
	waitUntil(t, "the router's last Ack settled", func() bool { return sub.Stats().InFlight == 0 })
	// The steps' acknowledgments count in the Subscriber's Acked (and its
	// subscriber_acked_total), as its own XACKs would.
	waitUntil(t, "every input counted as acknowledged", func() bool { return sub.Stats().Acked == 20 })
	// The time is the scenario: an XACK of the router's Acks, had the loop
	// queued one, would be flushed within these five AckFlushIntervals.
	time.Sleep(50 * time.Millisecond)
	// One XACK per step (a script's commands count too), none after.
	after := e.serverCallsOf("xack", "exec")
	xacks, interrupts := after[0]-before[0], after[1]-before[1]
	assert.Equal(t, 20+interrupts, xacks, "XACKs: the Acks after the steps sent XACKs of their own (%d of them interrupts')", interrupts)
}

func TestExactlyOnceWritesWhatTheHandlerPublishesWithItsContext(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	bus, err := cqrs.NewEventBusWithConfig(pub, cqrs.EventBusConfig{
		GeneratePublishTopic: func(cqrs.GenerateEventPublishTopicParams) (string, error) { return e.topic + "-events", nil },
		Marshaler:            cqrs.JSONMarshaler{},
	})
	require.NoError(t, err)
	var failOnce sync.Map
	e.runRouter(sub, func(msg *message.Message) error {
		if err := bus.Publish(msg.Context(), &struct{ Input string }{msg.UUID}); err != nil {
			return err
		}
		if _, seen := failOnce.LoadOrStore(msg.UUID, true); !seen {
			return errors.New("the first handling fails after publishing")
		}
		return nil
	}, (&middleware.Retry{MaxRetries: 1}).Middleware, x.Middleware) // each attempt its own step
	e.publish(10)
	waitUntil(t, "every input committed", func() bool { return x.Stats().Committed == 10 })
	events := e.stored(e.topic + "-events")
	assert.Len(t, events, 10, "a failed handling's event was written, or a committed one's twice")
	assert.Zero(t, e.pendingCount(e.topic, "g"))
}

// TestExactlyOnceWritesNothingForADeliveryThatIsNoLongerItsOwn moves the
// entry in flight to another consumer while the handler runs (as a peer's
// claim after ClaimMinIdle does): the step writes nothing, and the
// router's Ack does not take the entry from the peer.
func TestExactlyOnceWritesNothingForADeliveryThatIsNoLongerItsOwn(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	out := e.topic + "-out"
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	ctx := context.Background()
	e.runTransform(sub, pub, out, func(msg *message.Message) ([]*message.Message, error) {
		id := msg.Metadata.Get(valkeystream.MetadataEntryID)
		// A peer takes the entry over (its delivery count grows).
		if err := e.client.XClaim(ctx, &redis.XClaimArgs{Stream: e.topic, Group: "g", Consumer: "peer", Messages: []string{id}}).Err(); err != nil {
			return nil, err
		}
		return []*message.Message{outputOf(msg)}, nil
	}, x.Middleware)
	e.publish(1)
	waitUntil(t, "the step superseded", func() bool { return x.Stats().Superseded == 1 })
	waitUntil(t, "the router's Ack settled", func() bool { return sub.Stats().InFlight == 0 })
	// The time is the scenario: the router's Ack, had the loop queued an
	// XACK of it, would be flushed within these five AckFlushIntervals.
	time.Sleep(50 * time.Millisecond)
	assert.Empty(t, e.stored(out), "the superseded handling's output was written")
	p := e.pending("g")
	require.Len(t, p, 1, "the router's Ack took the entry from the peer")
	assert.Equal(t, "peer", p[0].Consumer)
	assert.Zero(t, x.Stats().Committed)
	assert.Zero(t, sub.Stats().Acked, "a superseded step acknowledged nothing")
}

func TestExactlyOnceStepIsSafeToSendTwice(t *testing.T) {
	// A step whose reply was lost is sent again: the second finds the
	// input acknowledged and writes nothing. A handler that runs the step
	// twice by hand (two handlings of one delivery) shows it.
	testserver.Parallel(t)
	e := newEnv(t)
	out := e.topic + "-out"
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	once := x.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputOf(msg)}, nil
	})
	e.runTransform(sub, pub, out, func(msg *message.Message) ([]*message.Message, error) {
		if _, err := once(msg); err != nil {
			return nil, err
		}
		return once(msg)
	})
	e.publish(5)
	waitUntil(t, "every input handled", func() bool { return x.Stats().Committed+x.Stats().Superseded == 10 })
	assert.Equal(t, int64(5), x.Stats().Committed)
	for uuid, n := range e.inputsOf(out) {
		assert.Equal(t, 1, n, "outputs of %s", uuid)
	}
	assert.Len(t, e.stored(out), 5)
}

func TestExactlyOnceWritesTheDeduplicatorsMarkInTheStep(t *testing.T) {
	for _, order := range []string{"dedup outside", "dedup inside"} {
		t.Run(order, func(t *testing.T) {
			testserver.Parallel(t)
			e := newEnv(t)
			out := e.topic + "-out"
			pub := e.publisher()
			x := e.exactlyOnce(pub)
			dedupClient := newClient(t, e.srv)
			var scripts atomic.Int64
			watchCommands(dedupClient, func(cmds ...redis.Cmder) {
				for _, c := range cmds {
					if isScript(c) {
						scripts.Add(1)
					}
				}
			})
			dedup, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: dedupClient}, testLogger())
			require.NoError(t, err)
			sub := e.subscriber("g", "c", fastRedelivery)
			mw := []message.HandlerMiddleware{dedup.Middleware, x.Middleware}
			if order == "dedup inside" {
				mw = []message.HandlerMiddleware{x.Middleware, dedup.Middleware}
			}
			// The skipped duplicate writes nothing: it is acknowledged by
			// the router's Ack, the usual way, whatever the order.
			const steps = 3
			e.runTransform(sub, pub, out, func(msg *message.Message) ([]*message.Message, error) {
				return []*message.Message{outputOf(msg)}, nil
			}, mw...)
			msgs := e.publish(3)
			// The same message published again: the Deduplicator skips it.
			require.NoError(t, pub.Publish(e.topic, msgs[0].Copy()))
			defer func() { t.Logf("exactly-once %+v dedup %+v", x.Stats(), dedup.Stats()) }()
			// The duplicate's Ack follows its skip: the router acknowledges
			// it after the handler returned; a step's mark is counted after
			// its commit. Both are waited for.
			waitUntil(t, "inputs committed and marked, the duplicate skipped and acknowledged", func() bool {
				return x.Stats().Committed == steps && dedup.Stats().Marked == steps &&
					dedup.Stats().Skipped == 1 && e.pendingCount(e.topic, "g") == 0
			})
			assert.Len(t, e.stored(out), 3)
			assert.Zero(t, dedup.Stats().MarkFailures)
			// The done marks went in the steps: the Deduplicator ran no script of its own.
			assert.Zero(t, scripts.Load(), "scripts of the Deduplicator")
			for _, m := range msgs {
				v, err := e.client.Get(context.Background(), "valkeystream:dedup:"+e.topic+":g:"+m.UUID).Result()
				require.NoError(t, err)
				assert.Equal(t, "done", v)
			}
		})
	}
}

func TestExactlyOnceRefusesWhatCannotBeOneStep(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	t.Run("a Publisher of another client", func(t *testing.T) {
		other := newClient(t, e.srv)
		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: other}, testLogger())
		require.NoError(t, err)
		x := e.exactlyOnce(pub)
		sub := e.subscriber("other-client", "c")
		msgs := e.subscribe(sub)
		e.publish(1)
		msg := receive(t, msgs)
		var called bool
		_, err = x.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(msg)
		require.ErrorIs(t, err, valkeystream.ErrNotAtomic)
		assert.False(t, called, "the handler ran")
		msg.Nack()
	})
	t.Run("a message not delivered by a consumer group", func(t *testing.T) {
		x := e.exactlyOnce(e.publisher())
		msg := message.NewMessage(watermill.NewUUID(), nil)
		_, err := x.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
		require.ErrorIs(t, err, valkeystream.ErrNotAtomic)
	})
	t.Run("a publish after the handler returned", func(t *testing.T) {
		pub := e.publisher()
		x := e.exactlyOnce(pub)
		sub := e.subscriber("late", "c")
		msgs := e.subscribe(sub)
		e.publish(1)
		msg := receive(t, msgs)
		var handlerCtx context.Context
		_, err := x.Middleware(func(m *message.Message) ([]*message.Message, error) {
			handlerCtx = m.Context()
			return nil, nil
		})(msg)
		require.NoError(t, err)
		late := message.NewMessage(watermill.NewUUID(), nil)
		late.SetContext(handlerCtx)
		require.ErrorIs(t, pub.Publish(e.topic+"-late", late), valkeystream.ErrNotAtomic)
		n, err := e.client.Exists(ctx, e.topic+"-late").Result()
		require.NoError(t, err)
		assert.Zero(t, n)
		msg.Ack()
	})
}

func TestExactlyOnceWritesNothingWhenAnOutputKeyHasAnotherType(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	good, bad := e.topic+"-good", e.topic+"-bad"
	require.NoError(t, e.client.Set(ctx, bad, "a string", 0).Err())
	pub := e.publisher()
	x := e.exactlyOnce(pub, func(c *valkeystream.ExactlyOnceConfig) { c.CommitTimeout = 200 * time.Millisecond })
	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	e.publish(1)
	msg := receive(t, msgs)
	_, err := x.Middleware(func(m *message.Message) ([]*message.Message, error) {
		for _, key := range []string{good, bad} {
			o := outputOf(m)
			o.SetContext(m.Context())
			require.NoError(t, pub.Publish(key, o))
		}
		return nil, nil
	})(msg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WRONGTYPE")
	assert.Empty(t, e.stored(good), "an output before the refused one was written")
	assert.Equal(t, int64(1), e.pendingCount(e.topic, "g"))
	assert.Equal(t, int64(1), x.Stats().Failed)
	msg.Nack()
}

func TestExactlyOnceDelaysADelayedOutputInTheStep(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	out := e.topic + "-out"
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	e.runTransform(sub, pub, out, func(msg *message.Message) ([]*message.Message, error) {
		o := outputOf(msg)
		o.Metadata.Set("_watermill_delayed_for", (300 * time.Millisecond).String())
		return []*message.Message{o}, nil
	}, x.Middleware)
	e.publish(1)
	waitUntil(t, "committed", func() bool { return x.Stats().Committed == 1 })
	key, err := valkeystream.DelayedKey(out)
	require.NoError(t, err)
	n, err := e.client.ZCard(context.Background(), key).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "the delayed output is not in the delayed set")
	assert.Empty(t, e.stored(out))
	outs := e.subscribeTo(e.subscriber("reader", "c"), out)
	got := receive(t, outs)
	assert.Equal(t, "out:0", string(got.Payload))
	got.Ack()
}

func TestExactlyOnceOnACluster(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	base := watermill.NewShortUUID()
	newPub := func() *valkeystream.Publisher {
		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, testLogger())
		require.NoError(t, err)
		return pub
	}
	newSub := func(group string) *valkeystream.Subscriber {
		sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, ConsumerGroup: group, Consumer: "c",
			Start: valkeystream.StartHead, NackResendDelay: 5 * time.Millisecond}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	// run runs a transform from in to out; state, unless nil, adds the
	// handler's state writes.
	run := func(t *testing.T, in, out string, pub *valkeystream.Publisher, x *valkeystream.ExactlyOnce, calls *atomic.Int64, state ...func(*valkeystream.Step) error) {
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: receiveTimeout}, testLogger())
		require.NoError(t, err)
		router.AddHandler("t", in, newSub("g-"+in), out, pub, func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			for _, f := range state {
				s, err := valkeystream.StepOf(msg.Context())
				if err != nil {
					return nil, err
				}
				if err := f(s); err != nil {
					return nil, err
				}
			}
			return []*message.Message{outputOf(msg)}, nil
		}).AddMiddleware(x.Middleware)
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()
		t.Cleanup(func() { _ = router.Close() })
		msgs := make([]*message.Message, 10)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
		}
		require.NoError(t, pub.Publish(in, msgs...))
	}
	t.Run("topics with one hash tag", func(t *testing.T) {
		in, out := "{"+base+"}.in", "{"+base+"}.out"
		pub := newPub()
		x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, testLogger())
		require.NoError(t, err)
		var calls atomic.Int64
		run(t, in, out, pub, x, &calls)
		waitUntil(t, "committed", func() bool { return x.Stats().Committed == 10 })
		n, err := client.XLen(context.Background(), out).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(10), n)
	})
	t.Run("state keys in the input's slot", func(t *testing.T) {
		in, out, count := "{"+base+"}.st-in", "{"+base+"}.st-out", "{"+base+"}:count"
		pub := newPub()
		x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, testLogger())
		require.NoError(t, err)
		var calls atomic.Int64
		run(t, in, out, pub, x, &calls, func(s *valkeystream.Step) error { return s.IncrBy(count, 1) })
		waitUntil(t, "committed", func() bool { return x.Stats().Committed == 10 })
		assert.Equal(t, "10", client.Get(context.Background(), count).Val())
		assert.Equal(t, int64(10), x.Stats().StateWrites)
	})
	t.Run("a state key in another slot is refused, even with the fallback", func(t *testing.T) {
		in, out, other := "{"+base+"}.so-in", "{"+base+"}.so-out", base+":elsewhere"
		pub := newPub()
		x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub, NonAtomicFallback: true}, testLogger())
		require.NoError(t, err)
		var calls atomic.Int64
		var refusals atomic.Int64
		run(t, in, out, pub, x, &calls, func(s *valkeystream.Step) error {
			err := s.Set(other, "x", 0)
			if errors.Is(err, valkeystream.ErrNotAtomic) {
				refusals.Add(1)
			}
			return err
		})
		waitUntil(t, "refused on several deliveries", func() bool { return refusals.Load() >= 10 })
		assert.Zero(t, x.Stats().Committed)
		assert.Zero(t, x.Stats().NonAtomic)
		for _, key := range []string{other, out} { // two slots: two calls
			n, err := client.Exists(context.Background(), key).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "%s was written", key)
		}
	})
	t.Run("topics in two slots fail before the handler runs", func(t *testing.T) {
		in, out := base+".plain-in", base+".plain-out"
		pub := newPub()
		x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, testLogger())
		require.NoError(t, err)
		var calls atomic.Int64
		run(t, in, out, pub, x, &calls)
		waitUntil(t, "refused", func() bool { return x.Stats().Refused >= 10 })
		assert.Zero(t, calls.Load(), "the handler ran")
		assert.Zero(t, x.Stats().Committed)
		n, err := client.Exists(context.Background(), out).Result()
		require.NoError(t, err)
		assert.Zero(t, n)
	})
	t.Run("topics in two slots with the fallback", func(t *testing.T) {
		in, out := base+".fb-in", base+".fb-out"
		pub := newPub()
		x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub, NonAtomicFallback: true}, testLogger())
		require.NoError(t, err)
		var calls atomic.Int64
		run(t, in, out, pub, x, &calls)
		waitUntil(t, "published the usual way", func() bool { return x.Stats().NonAtomic == 10 })
		waitUntil(t, "outputs", func() bool {
			n, err := client.XLen(context.Background(), out).Result()
			return err == nil && n == 10
		})
		assert.Zero(t, x.Stats().Committed)
	})
}

// TestExactlyOnceCommitsReclaimedAndDrainedEntries checks the fencing token
// of deliveries that are not first ones: entries a dead consumer left
// (reclaimed by a claim, inside a read on Redis 8.4+), and the own pending
// entries a restart drains, each with a delivery count above 1.
func TestExactlyOnceCommitsReclaimedAndDrainedEntries(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	out := e.topic + "-out"
	e.publish(3)
	e.readAs("g", "dead", 2) // reclaimed by c after ClaimMinIdle
	e.readAs("g", "c", 1)    // drained by c on its start
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", shortClaim, fastRedelivery)
	e.runTransform(sub, pub, out, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputOf(msg)}, nil
	}, x.Middleware)
	waitUntil(t, "every input committed", func() bool { return x.Stats().Committed == 3 })
	assert.Zero(t, x.Stats().Superseded, "a reclaimed or drained delivery's step found its count changed")
	assert.Len(t, e.stored(out), 3)
	assert.Zero(t, e.pendingCount(e.topic, "g"))
}
