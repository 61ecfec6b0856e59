package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/components/requeuer"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// arrival is a message received by a collector, and when.
type arrival struct {
	msg *message.Message
	at  time.Time
}

// collector receives and Acks the messages of a subscription, recording when
// each arrived.
type collector struct {
	mu   sync.Mutex
	got  []arrival
	done chan struct{} // closed when the subscription's channel closes
}

func collectArrivals(msgs <-chan *message.Message) *collector {
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for m := range msgs {
			at := time.Now()
			c.mu.Lock()
			c.got = append(c.got, arrival{m, at})
			c.mu.Unlock()
			m.Ack()
		}
	}()
	return c
}

func (c *collector) arrivals() []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]arrival(nil), c.got...)
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// delayed returns a message with payload and Watermill's delay metadata.
func delayed(payload string, d delay.Delay) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	delay.Message(m, d)
	return m
}

// Messages delayed by 0.5 to 3 s arrive, to a group and to a fan-out reader
// alike, never before they are due and in due order; they keep their UUID
// and metadata. How late after their due time they arrive is logged, not
// bounded (about 50 ms on a quiet machine, seconds on a loaded one): the
// pace of the moves is proven without a clock in internal/delay
// (TestDelayedMoverBeat, TestDelayedMoverIdleUntilNotified).
func TestDelayedMessagesArriveWhenDueInDueOrder(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	group := collectArrivals(e.subscribe(e.subscriber("g", "c")))
	fanOut := collectArrivals(e.subscribe(e.subscriber("", "", func(c *valkeystream.SubscriberConfig) { c.Start = valkeystream.StartNew })))

	delays := []time.Duration{3 * time.Second, 500 * time.Millisecond, 2 * time.Second, 1 * time.Second, 1500 * time.Millisecond, 2500 * time.Millisecond}
	made := time.Now() // the delays are made after this instant
	var msgs []*message.Message
	due := map[string]time.Time{}
	for i, d := range delays {
		m := delayed(fmt.Sprint(i), delay.For(d))
		m.Metadata.Set("k", "v")
		msgs = append(msgs, m)
		due[m.UUID] = made.Add(d)
	}
	now := message.NewMessage(watermill.NewUUID(), []byte("now"))
	msgs = append(msgs, now)
	due[now.UUID] = made
	require.NoError(t, e.publisher().Publish(e.topic, msgs...))
	published := time.Now() // the server stored them before this instant

	for name, c := range map[string]*collector{"group": group, "fan-out": fanOut} {
		waitUntil(t, name+" receives every message", func() bool { return c.count() == len(msgs) })
		got := c.arrivals()
		var late, afterReturn []time.Duration
		for i, a := range got {
			want, ok := due[a.msg.UUID]
			require.True(t, ok, "%s: unknown message %s", name, a.msg.UUID)
			if a.at.Before(want) {
				t.Errorf("%s: message %q arrived %s before it was due", name, a.msg.Payload, want.Sub(a.at))
			}
			if i > 0 && due[got[i-1].msg.UUID].After(want) {
				t.Errorf("%s: message %q arrived after %q, which is due later", name, a.msg.Payload, got[i-1].msg.Payload)
			}
			if a.msg.UUID != now.UUID {
				late = append(late, a.at.Sub(want))
				afterReturn = append(afterReturn, a.at.Sub(published.Add(want.Sub(made))))
				assert.Equal(t, "v", a.msg.Metadata.Get("k"), "%s: metadata lost", name)
				assert.NotEmpty(t, a.msg.Metadata.Get(delay.DelayedForKey), "%s: delay metadata dropped", name)
			}
		}
		slices.Sort(late)
		slices.Sort(afterReturn)
		t.Logf("%s: arrival after the due time: %s to %s counted from before the Publish call, %s to %s from its return",
			name, late[0].Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond),
			afterReturn[0].Round(time.Millisecond), afterReturn[len(afterReturn)-1].Round(time.Millisecond))
	}
	assert.Zero(t, e.client.Exists(context.Background(), "{"+e.topic+"}:delayed").Val(), "the sorted set is not empty")
}

func TestDelayedPollIntervalValidate(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	for _, tc := range []struct {
		interval time.Duration
		ok       bool
	}{{0, true}, {-1, true}, {time.Millisecond, true}, {time.Microsecond, false}} {
		_, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
			Client: e.client, Start: valkeystream.StartNew, DelayedPollInterval: tc.interval,
		}, nil)
		if tc.ok != (err == nil) {
			t.Errorf("DelayedPollInterval %s: error %v, want ok=%t", tc.interval, err, tc.ok)
		}
		if err != nil {
			assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
			assert.ErrorContains(t, err, "DelayedPollInterval")
		}
	}
}

func TestDelayedIdlePollIntervalValidate(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	for _, tc := range []struct {
		poll, idle time.Duration
		ok         bool
	}{
		{0, 0, true},
		{0, valkeystream.AlwaysPollDelayed, true},
		{0, valkeystream.DefaultDelayedPollInterval, true},
		{0, time.Hour, true},
		{0, valkeystream.DefaultDelayedPollInterval - 1, false},
		{0, -2, false},
		{5 * time.Second, 0, true}, // the default follows a longer DelayedPollInterval
		{5 * time.Second, time.Second, false},
		{-1, time.Nanosecond, true}, // moving is off: not used
	} {
		_, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
			Client: e.client, Start: valkeystream.StartNew, DelayedPollInterval: tc.poll, DelayedIdlePollInterval: tc.idle,
		}, nil)
		if tc.ok != (err == nil) {
			t.Errorf("DelayedPollInterval %s, DelayedIdlePollInterval %s: error %v, want ok=%t", tc.poll, tc.idle, err, tc.ok)
		}
		if err != nil {
			assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
			assert.ErrorContains(t, err, "DelayedIdlePollInterval")
		}
	}
}

// A mover that fails (its sorted set key holds another type) counts each
// failure, logs the streak once, backs off, and resumes once the key is
// fixed.
func TestDelayedMoverFailuresAreCountedLoggedOnceAndResume(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	delayedKey, err := valkeystream.DelayedKey(e.topic)
	require.NoError(t, err)
	require.NoError(t, e.client.Set(context.Background(), delayedKey, "not a sorted set", 0).Err())

	log := newErrorLog(testLogger())
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: e.client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartHead,
		DelayedPollInterval: 10 * time.Millisecond,
	}, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	got := collectArrivals(e.subscribe(sub))

	waitUntil(t, "three failed moves", func() bool { return sub.Stats().Faults >= 3 })
	if n := log.errors(); n != 1 {
		t.Fatalf("%d Error lines for one streak of failures, want 1: %s", n, log.first(3))
	}
	require.NoError(t, e.client.Del(context.Background(), delayedKey).Err())
	require.NoError(t, e.publisher().Publish(e.topic, delayed("x", delay.For(50*time.Millisecond))))
	waitUntil(t, "the delayed message arrives", func() bool { return got.count() == 1 })
}

// A topic whose stream key has '}' but no hash tag cannot hold delayed
// messages: Publish says so and writes nothing.
func TestDelayedMessageToATopicWithoutASlotFails(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	msg := delayed("x", delay.For(time.Minute))
	err := e.publisher().Publish("odd}topic", msg)
	var pubErr *valkeystream.PublishError
	require.ErrorAs(t, err, &pubErr)
	assert.Equal(t, []string{msg.UUID}, pubErr.NotSent)
	assert.ErrorContains(t, err, "hash tag")
}

// delay.Until, delay.NewPublisher with a delay in the context, and a due time
// in the past (delivered at once, straight into the stream).
func TestDelayUntilContextAndPast(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	got := collectArrivals(e.subscribe(e.subscriber("g", "c")))
	pub, err := delay.NewPublisher(e.publisher(), delay.PublisherConfig{AllowNoDelay: true})
	require.NoError(t, err)

	start := time.Now()
	until := delayed("until", delay.Until(start.Add(1200*time.Millisecond)))
	viaCtx := message.NewMessage(watermill.NewUUID(), []byte("context"))
	viaCtx.SetContext(delay.WithContext(context.Background(), delay.For(800*time.Millisecond)))
	past := delayed("past", delay.Until(start.Add(-time.Hour)))
	require.NoError(t, pub.Publish(e.topic, until, viaCtx, past))
	// The message due in the past went straight into the stream.
	require.Len(t, e.stored(e.topic), 1)

	waitUntil(t, "every message arrives", func() bool { return got.count() == 3 })
	want := map[string]time.Time{"past": start, "context": start.Add(800 * time.Millisecond), "until": start.Add(1200 * time.Millisecond)}
	var order []string
	for _, a := range got.arrivals() {
		order = append(order, string(a.msg.Payload))
		if a.at.Before(want[string(a.msg.Payload)]) {
			t.Errorf("message %q arrived %s before it was due", a.msg.Payload, want[string(a.msg.Payload)].Sub(a.at))
		}
	}
	assert.Equal(t, []string{"past", "context", "until"}, order)
}

// Messages waiting when their subscriber closes are delivered by the next
// subscriber; publishing the same message twice stores it once.
func TestDelayedMessagesOutliveTheirSubscriber(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	first := e.subscriber("g", "c")
	firstGot := collectArrivals(e.subscribe(first))

	msgs := []*message.Message{delayed("a", delay.For(700*time.Millisecond)), delayed("b", delay.For(900*time.Millisecond))}
	pub := e.publisher()
	require.NoError(t, pub.Publish(e.topic, msgs...))
	require.NoError(t, pub.Publish(e.topic, msgs[0])) // a retry of a publish whose reply was lost
	require.NoError(t, first.Close())
	<-firstGot.done
	assert.Zero(t, firstGot.count(), "a message arrived before it was due")

	time.Sleep(time.Second) // both are due now, and nobody moves them
	require.Empty(t, e.stored(e.topic), "moved without a subscription")
	second := collectArrivals(e.subscribe(e.subscriber("g", "c")))
	waitUntil(t, "the next subscriber receives both", func() bool { return second.count() == 2 })
	time.Sleep(200 * time.Millisecond) // two beats: nothing more comes
	assert.Len(t, second.arrivals(), 2)
	assert.Len(t, e.stored(e.topic), 2, "the stream holds a message twice")
}

// Server kills while delayed messages wait and while they are being moved
// (the append-only file is fsynced on every write, as the tests run it) lose
// none of them and store none twice in the stream.
func TestDelayedMessagesSurviveServerKills(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	if !e.srv.Restartable() {
		t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be restarted by the test")
	}
	// A read whose reply a kill cut off leaves its entries pending without
	// the subscription knowing (go-redis retried the read): they come back
	// through the reclaim, after ClaimMinIdle, kept short here.
	got := collectArrivals(e.subscribe(e.subscriber("g", "c", fastRedelivery, func(c *valkeystream.SubscriberConfig) {
		c.ClaimMinIdle = time.Second
		c.ClaimInterval = 200 * time.Millisecond
	})))
	const n = 500
	var msgs []*message.Message
	for i := range n {
		// Due times spread over 0.3 s to 2.3 s.
		msgs = append(msgs, delayed(fmt.Sprint(i), delay.For(300*time.Millisecond+time.Duration(i)*4*time.Millisecond)))
	}
	pub := e.publisher()
	for i := 0; i < n; i += 50 {
		require.NoError(t, pub.Publish(e.topic, msgs[i:i+50]...))
	}
	// One kill before anything is due, three while messages are moved.
	for _, at := range []time.Duration{0, 600 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond} {
		time.Sleep(at) // the time is the scenario: the schedule of the kills
		require.NoError(t, e.srv.Kill())
		time.Sleep(100 * time.Millisecond) // the time is the scenario: the outage
		require.NoError(t, e.srv.StartAgain())
	}

	arrived := func() int {
		seen := map[string]bool{}
		for _, a := range got.arrivals() {
			seen[a.msg.UUID] = true
		}
		return len(seen)
	}
	delayedKey, err := valkeystream.DelayedKey(e.topic)
	require.NoError(t, err)
	for deadline := time.Now().Add(receiveTimeout); arrived() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			p, _ := e.client.XPending(context.Background(), e.topic, "g").Result()
			t.Fatalf("%d of %d messages arrived within %s; %d entries in the stream, %d waiting in %s, pending %+v",
				arrived(), n, receiveTimeout, len(e.stored(e.topic)), e.client.ZCard(context.Background(), delayedKey).Val(), delayedKey, p)
		}
	}
	inStream := map[string]int{}
	for _, m := range e.stored(e.topic) {
		inStream[m.UUID]++
	}
	for _, m := range msgs {
		if inStream[m.UUID] != 1 {
			t.Errorf("message %q is in the stream %d times, want 1", m.Payload, inStream[m.UUID])
		}
	}
	t.Logf("%d messages, %d deliveries (redeliveries after the kills included)", n, got.count())
}

// middleware.DelayOnError with a poison queue that publishes back to the
// consumed topic: a failed message returns after the delay, growing, with no
// requeuer.
func TestDelayOnErrorBackToTheSameTopic(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub := e.publisher()
	poison, err := middleware.PoisonQueue(pub, e.topic)
	require.NoError(t, err)
	delayOnError := middleware.DelayOnError{InitialInterval: 500 * time.Millisecond, MaxInterval: 2 * time.Second, Multiplier: 2}

	var mu sync.Mutex
	var calls []time.Time
	e.runRouter(e.subscriber("g", "c"), func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		if len(calls) < 3 {
			return errors.New("not yet")
		}
		return nil
	}, poison, delayOnError.Middleware)

	require.NoError(t, pub.Publish(e.topic, message.NewMessage(watermill.NewUUID(), []byte("x"))))
	waitUntil(t, "the third try", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) >= 3 })
	time.Sleep(300 * time.Millisecond) // nothing more comes
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 3 {
		t.Fatalf("handler ran %d times, want 3", len(calls))
	}
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second} {
		if gap := calls[i+1].Sub(calls[i]); gap < want {
			t.Errorf("try %d came %s after the previous one, want at least %s", i+2, gap, want)
		}
	}
	t.Logf("tries at +0, +%s, +%s", calls[1].Sub(calls[0]).Round(time.Millisecond), calls[2].Sub(calls[0]).Round(time.Millisecond))
}

// A handler that fails with middleware.DelayOnError sends its message through
// a poison queue to a requeue topic, from which Watermill's requeuer publishes
// it back; it comes back no earlier than the delay, and again later with the
// grown delay.
func TestDelayOnErrorWithRequeuer(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub := e.publisher()
	requeueTopic := e.topic + ".requeue"
	poison, err := middleware.PoisonQueue(pub, requeueTopic)
	require.NoError(t, err)
	delayOnError := middleware.DelayOnError{InitialInterval: 500 * time.Millisecond, MaxInterval: 2 * time.Second, Multiplier: 2}

	rq, err := requeuer.NewRequeuer(requeuer.Config{
		Subscriber:     e.subscriber("requeuer", "c"),
		SubscribeTopic: requeueTopic,
		Publisher:      pub,
		GeneratePublishTopic: func(p requeuer.GeneratePublishTopicParams) (string, error) {
			return p.Message.Metadata.Get(middleware.PoisonedTopicKey), nil
		},
	}, testLogger())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	rqDone := make(chan error, 1)
	go func() { rqDone <- rq.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-rqDone })

	var mu sync.Mutex
	var calls []time.Time
	e.runRouter(e.subscriber("g", "c"), func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		if len(calls) < 3 {
			return errors.New("not yet")
		}
		return nil
	}, poison, delayOnError.Middleware)

	require.NoError(t, pub.Publish(e.topic, message.NewMessage(watermill.NewUUID(), []byte("x"))))
	waitUntil(t, "the third try", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) >= 3 })
	mu.Lock()
	defer mu.Unlock()
	if gap := calls[1].Sub(calls[0]); gap < 500*time.Millisecond {
		t.Errorf("second try %s after the first, want at least 500ms", gap)
	}
	if gap := calls[2].Sub(calls[1]); gap < time.Second {
		t.Errorf("third try %s after the second, want at least 1s (the delay doubled)", gap)
	}
	t.Logf("tries at +0, +%s, +%s", calls[1].Sub(calls[0]).Round(time.Millisecond), calls[2].Sub(calls[0]).Round(time.Millisecond))
}

// BenchmarkPublishDelayed measures Publish of delayed messages (one script
// call per Publish), one and 100 per call; compare BenchmarkPublish.
func BenchmarkPublishDelayed(b *testing.B) {
	srv := testserver.Start(b)
	client := newClient(b, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	require.NoError(b, err)
	for _, perCall := range []int{1, 100} {
		b.Run(fmt.Sprintf("%d-per-call", perCall), func(b *testing.B) {
			topic := "bench-" + watermill.NewShortUUID()
			msgs := make([]*message.Message, perCall)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += perCall {
				for j := range msgs {
					msgs[j] = delayed("0123456789abcdef", delay.For(time.Hour))
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// With WaitReplicas, a Publish that carries delayed messages waits for the
// replicas too: on a server without replicas it fails with ErrNotReplicated
// like any other Publish, naming every message of the call, and the
// messages are stored all the same.
func TestDelayedPublishWaitsForReplicas(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub := e.publisher(func(c *valkeystream.PublisherConfig) {
		c.WaitReplicas = 1
		c.WaitTimeout = 50 * time.Millisecond
	})
	plain := newMessages(1)
	requireNotReplicated(t, pub.Publish(e.topic, plain...), plain)

	msgs := []*message.Message{delayed("later", delay.For(time.Minute)), newMessages(1)[0]}
	requireNotReplicated(t, pub.Publish(e.topic, msgs...), msgs)

	delayedKey, err := valkeystream.DelayedKey(e.topic)
	require.NoError(t, err)
	if got := e.client.ZCard(context.Background(), delayedKey).Val(); got != 1 {
		t.Fatalf("%d delayed messages stored, want 1", got)
	}
	if got := e.client.XLen(context.Background(), e.topic).Val(); got != 2 {
		t.Fatalf("%d entries in the stream, want 2 (the plain one and the one due now)", got)
	}
}

// A topic and the same name in a hash tag ("orders" and "{orders}") are two
// streams: each one's delayed messages reach its own stream only.
func TestDelayedMessagesStayWithTheirTopicBesideItsHashTaggedTwin(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	tagged := "{" + e.topic + "}"
	plainKey, err := valkeystream.DelayedKey(e.topic)
	require.NoError(t, err)
	taggedKey, err := valkeystream.DelayedKey(tagged)
	require.NoError(t, err)
	if plainKey == taggedKey {
		t.Fatalf("DelayedKey(%q) and DelayedKey(%q) are both %q", e.topic, tagged, plainKey)
	}

	pub := e.publisher()
	msg := delayed("tagged", delay.For(50*time.Millisecond))
	require.NoError(t, pub.Publish(tagged, msg))
	plain := e.subscribe(e.subscriber("g", "c")) // moves the plain topic's delayed messages
	sub := e.subscriber("g", "c")
	taggedMsgs, err := sub.Subscribe(context.Background(), tagged)
	require.NoError(t, err)
	got := receive(t, taggedMsgs)
	require.Equal(t, msg.UUID, got.UUID)
	got.Ack()
	expectNothing(t, plain, 300*time.Millisecond)
	if n := e.client.XLen(context.Background(), e.topic).Val(); n != 0 {
		t.Fatalf("%d entries in stream %q, want 0: a delayed message of %q went there", n, e.topic, tagged)
	}
}
