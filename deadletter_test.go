package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
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

// deliveries records the delivery count a handler saw on each call, by
// message UUID.
type deliveries struct {
	mu     sync.Mutex
	counts map[string][]int
}

func (d *deliveries) record(msg *message.Message) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.counts == nil {
		d.counts = map[string][]int{}
	}
	d.counts[msg.UUID] = append(d.counts[msg.UUID], valkeystream.DeliveryCount(msg))
}

func (d *deliveries) of(uuid string) []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int(nil), d.counts[uuid]...)
}

func (d *deliveries) calls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.counts {
		n += len(c)
	}
	return n
}

// flakyPublisher fails its first failures calls, then passes them to next.
type flakyPublisher struct {
	next message.Publisher

	mu       sync.Mutex
	failures int
	attempts int
}

var errDeadLetterStreamDown = errors.New("dead-letter stream unavailable")

func (p *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	p.attempts++
	fail := p.attempts <= p.failures
	p.mu.Unlock()
	if fail {
		return errDeadLetterStreamDown
	}
	return p.next.Publish(topic, msgs...)
}

func (p *flakyPublisher) Close() error { return nil }

func (p *flakyPublisher) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts
}

func TestDeadLetterAfterExactlyMaxDeliveries(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := message.NewMessage(watermill.NewUUID(), []byte("order 7"))
	sent.Metadata.Set("trace", "abc")
	require.NoError(t, e.publisher().Publish(e.topic, sent))

	var seen deliveries
	e.runRouter(e.subscriber("g", "worker", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		return errors.New("card declined")
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 3}))

	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	waitUntil(t, "dead-lettered and acknowledged", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	assert.Equal(t, []int{1, 2, 3}, seen.of(sent.UUID), "delivered exactly MaxDeliveries times")

	original, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, original, 1)
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
		valkeystream.MetadataOriginalDeliveryCount: "3",
	} {
		assert.Equal(t, want, dead.Metadata.Get(key), "metadata %s", key)
	}
	raw, err := e.client.XRange(context.Background(), deadKey, "-", "+").Result()
	require.NoError(t, err)
	assert.NotContains(t, raw[0].Values, valkeystream.MetadataDeliveryCount,
		"the per-delivery keys move to the original keys; the stored dead letter must not carry a stale count")
}

func TestDeadLetterLosesNothingAmongMany(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 200
	sent := e.publish(n) // payloads "0".."199"
	failing := map[string]bool{}
	for i, m := range sent {
		if i%10 == 0 {
			failing[m.UUID] = true
		}
	}

	var seen deliveries
	e.runRouter(e.subscriber("g", "c", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		if failing[msg.UUID] {
			return fmt.Errorf("message %s always fails", msg.Payload)
		}
		return nil
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 3}))

	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	// The deliveries take the machine's pace times their number (each
	// failing message's two redeliveries wait for their Nack backoff): a
	// wait while they keep coming, then for the last Acks.
	calls := n - len(failing) + 3*len(failing)
	waitGrowing(t, seen.calls, calls, "deliveries")
	waitUntil(t, "nothing pending", func() bool { return e.pendingCount(e.topic, "g") == 0 })
	assert.Equal(t, calls, seen.calls(), "deliveries")

	for _, m := range sent {
		if failing[m.UUID] {
			assert.Equal(t, []int{1, 2, 3}, seen.of(m.UUID), "failing message %s", m.Payload)
		} else {
			assert.Equal(t, []int{1}, seen.of(m.UUID), "succeeding message %s", m.Payload)
		}
	}
	var deadUUIDs, want []string
	for _, d := range e.stored(deadKey) {
		deadUUIDs = append(deadUUIDs, d.UUID)
		assert.Equal(t, "3", d.Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
	}
	for id := range failing {
		want = append(want, id)
	}
	sort.Strings(deadUUIDs)
	sort.Strings(want)
	assert.Equal(t, want, deadUUIDs, "every failing message dead-lettered exactly once, and nothing else")
}

func TestDeadLetterAfterRestart(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(1)[0]
	var seen deliveries
	secondFailing := make(chan struct{})

	stop := e.runRouter(e.subscriber("g", "worker", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		if valkeystream.DeliveryCount(msg) == 2 {
			close(secondFailing)
			<-msg.Context().Done() // still failing when the process stops
		}
		return errors.New("downstream unavailable")
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 3}))
	select {
	case <-secondFailing:
	case <-time.After(receiveTimeout):
		t.Fatalf("no second delivery within %s", receiveTimeout)
	}
	stop()

	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	p := e.pending("g")
	require.Len(t, p, 1, "two failed deliveries leave the message pending")
	assert.Equal(t, int64(2), p[0].RetryCount)
	assert.Empty(t, e.stored(deadKey))

	e.runRouter(e.subscriber("g", "worker", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		return errors.New("downstream unavailable")
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 3}))
	waitUntil(t, "dead-lettered after the restart", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	assert.Equal(t, []int{1, 2, 3}, seen.of(sent.UUID), "the restart's drain is the third delivery")
	assert.Equal(t, "3", e.stored(deadKey)[0].Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
}

func TestDeadLetterPublishFailureIsRetriedOnTheNextDelivery(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(1)[0]
	var seen deliveries
	pub := &flakyPublisher{next: e.publisher(), failures: 2}

	e.runRouter(e.subscriber("g", "c", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		return errors.New("always fails")
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 2}))

	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	waitUntil(t, "dead-lettered once the publisher recovered", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	assert.Equal(t, []int{1, 2, 3, 4}, seen.of(sent.UUID), "each failed publish Nacks the message, which comes back")
	assert.Equal(t, 3, pub.calls())
	assert.Equal(t, "4", e.stored(deadKey)[0].Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
}

func TestDeadLetterWithClosedPublisherLeavesItPending(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(1)[0]
	var seen deliveries
	closed := e.publisher()
	require.NoError(t, closed.Close())

	stop := e.runRouter(e.subscriber("g", "worker", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		return errors.New("always fails")
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: closed, MaxDeliveries: 2}))
	waitUntil(t, "three failed deliveries", func() bool { return seen.calls() >= 3 })
	stop()

	deadKey := e.topic + valkeystream.DefaultDeadLetterSuffix
	require.Len(t, e.pending("g"), 1, "a dead letter that could not be published leaves the message pending")
	assert.Empty(t, e.stored(deadKey))

	e.runRouter(e.subscriber("g", "worker", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		return errors.New("always fails")
	}, e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 2}))
	waitUntil(t, "dead-lettered by the next process", func() bool {
		return len(e.stored(deadKey)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	counts := seen.of(sent.UUID)
	assert.Equal(t, fmt.Sprint(counts[len(counts)-1]),
		e.stored(deadKey)[0].Metadata.Get(valkeystream.MetadataOriginalDeliveryCount),
		"the dead letter records its last delivery")
}

func TestDeliveryLimitWithPoisonQueueAndRetry(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(1)[0]
	poisonTopic := e.topic + ".poison"
	poison, err := middleware.PoisonQueueWithFilter(e.publisher(), poisonTopic, func(err error) bool {
		return errors.Is(err, valkeystream.ErrDeliveryLimit)
	})
	require.NoError(t, err)
	limit, err := valkeystream.DeliveryLimit(3)
	require.NoError(t, err)
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Multiplier: 1}

	var seen deliveries
	e.runRouter(e.subscriber("g", "worker", fastRedelivery), func(msg *message.Message) error {
		seen.record(msg)
		return errors.New("schema mismatch")
	}, poison, limit, retry.Middleware)

	waitUntil(t, "poisoned and acknowledged", func() bool {
		return len(e.stored(poisonTopic)) == 1 && e.pendingCount(e.topic, "g") == 0
	})
	assert.Equal(t, []int{1, 1, 1, 2, 2, 2, 3, 3, 3}, seen.of(sent.UUID),
		"in-process retries do not grow the server's count; the limit counts deliveries")
	got := e.stored(poisonTopic)[0]
	assert.Equal(t, sent.UUID, got.UUID)
	assert.Equal(t, "schema mismatch", got.Metadata.Get(valkeystream.MetadataError))
	assert.Equal(t, "3", got.Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
	assert.Equal(t, e.topic, got.Metadata.Get(valkeystream.MetadataOriginalTopic))
	assert.Equal(t, "g", got.Metadata.Get(valkeystream.MetadataOriginalGroup))
	assert.Equal(t, "worker", got.Metadata.Get(valkeystream.MetadataOriginalConsumer))
	assert.NotEmpty(t, got.Metadata.Get(valkeystream.MetadataOriginalEntryID))
	assert.Contains(t, got.Metadata.Get(middleware.ReasonForPoisonedKey), valkeystream.ErrDeliveryLimit.Error())
}

func TestUndecodableEntryIsDeadLetteredAsAMessage(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	const prefix = "app:"
	key := prefix + e.topic
	withUUID, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: key,
		Values: []any{"uuid", "raw-1", "foo", "bar", "bin", "\xff\x00"}}).Result() // no payload
	require.NoError(t, err)
	withoutUUID, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"foo", "baz"}}).Result()
	require.NoError(t, err)
	good := message.NewMessage(watermill.NewUUID(), []byte("fine"))
	require.NoError(t, e.publisher(func(c *valkeystream.PublisherConfig) { c.KeyPrefix = prefix }).Publish(e.topic, good))

	prefixed := func(c *valkeystream.SubscriberConfig) { c.KeyPrefix = prefix }
	sub := e.subscriber("g", "worker", fastRedelivery, prefixed)
	got := receive(t, e.subscribe(sub))
	assert.Equal(t, good.UUID, got.UUID)
	got.Ack()
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(0), e.pendingCount(key, "g"), "undecodable entries are acknowledged once copied")
	assert.Equal(t, int64(2), sub.Stats().InvalidEntries)

	// The dead-letter topic is an ordinary topic: a Subscriber reads it.
	deadMsgs, err := e.subscriber("dead-readers", "r", prefixed).Subscribe(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix)
	require.NoError(t, err)
	first := receive(t, deadMsgs)
	first.Ack() // the next comes after this one is settled
	second := receive(t, deadMsgs)
	second.Ack()

	assert.Equal(t, "raw-1", first.UUID, "the raw uuid is kept")
	assert.Empty(t, first.Payload)
	for k, want := range map[string]string{
		"foo":                                      "bar",
		"bin":                                      "\xff\x00",
		valkeystream.MetadataOriginalTopic:         e.topic,
		valkeystream.MetadataOriginalStream:        key,
		valkeystream.MetadataOriginalEntryID:       withUUID,
		valkeystream.MetadataOriginalGroup:         "g",
		valkeystream.MetadataOriginalConsumer:      "worker",
		valkeystream.MetadataOriginalDeliveryCount: "1",
	} {
		assert.Equal(t, want, first.Metadata.Get(k), "metadata %s", k)
	}
	assert.Contains(t, first.Metadata.Get(valkeystream.MetadataError), `no "payload" field`)
	assert.Equal(t, "dead-readers", first.Metadata.Get(valkeystream.MetadataGroup),
		"the delivery keys describe the dead letter's own delivery")

	assert.Len(t, second.UUID, 36, "an entry without uuid gets one derived from its stream and id")
	assert.Equal(t, "baz", second.Metadata.Get("foo"))
	assert.Equal(t, withoutUUID, second.Metadata.Get(valkeystream.MetadataOriginalEntryID))
	assert.Contains(t, second.Metadata.Get(valkeystream.MetadataError), `no "uuid" field`)
}

// recordingPublisher records what it is asked to publish and fails with err
// when it is set.
type recordingPublisher struct {
	mu     sync.Mutex
	err    error
	topics []string
	msgs   []*message.Message
}

func (p *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.topics = append(p.topics, topic)
	p.msgs = append(p.msgs, msgs...)
	return p.err
}

func (p *recordingPublisher) Close() error { return nil }

// delivered returns a message as a Subscriber delivers it on its count-th
// delivery.
func delivered(count int) *message.Message {
	msg := message.NewMessage("m-1", []byte("p"))
	if count > 0 {
		msg.Metadata.Set(valkeystream.MetadataDeliveryCount, fmt.Sprint(count))
		msg.Metadata.Set(valkeystream.MetadataEntryID, "1-0")
		msg.Metadata.Set(valkeystream.MetadataStream, "orders")
		msg.Metadata.Set(valkeystream.MetadataGroup, "g")
		msg.Metadata.Set(valkeystream.MetadataConsumer, "c")
	}
	return msg
}

var errHandler = errors.New("handler failed")

func failing(*message.Message) ([]*message.Message, error) { return nil, errHandler }

func mustNotRun(*message.Message) ([]*message.Message, error) { panic("the handler must not run") }

func TestDeadLetterRules(t *testing.T) {
	tests := []struct {
		name        string
		config      valkeystream.DeadLetterConfig
		msg         *message.Message
		handler     message.HandlerFunc
		publishErr  error
		closing     bool // the subscription closes while the handler runs
		expires     bool // the subscription's deadline passes while the handler runs
		wantErr     []error
		wantDeadErr string // MetadataError of the dead letter; default errHandler
		wantErrText string
		wantTopic   string
	}{
		{name: "success passes", config: valkeystream.DeadLetterConfig{MaxDeliveries: 1, Topic: "dead"}, msg: delivered(5),
			handler: func(*message.Message) ([]*message.Message, error) { return nil, nil }},
		{name: "below the limit the failure passes", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3, Topic: "dead"}, msg: delivered(2),
			handler: failing, wantErr: []error{errHandler}},
		{name: "no delivery count is never dead-lettered", config: valkeystream.DeadLetterConfig{MaxDeliveries: 1, Topic: "dead"}, msg: delivered(0),
			handler: failing, wantErr: []error{errHandler}},
		{name: "at the limit it is published", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3, Topic: "dead"}, msg: delivered(3),
			handler: failing, wantTopic: "dead"},
		{name: "past the limit it is published", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3, Topic: "dead"}, msg: delivered(7),
			handler: failing, wantTopic: "dead"},
		{name: "a failed publish keeps both errors", config: valkeystream.DeadLetterConfig{MaxDeliveries: 1, Topic: "dead"}, msg: delivered(1),
			handler: failing, publishErr: valkeystream.ErrPublisherClosed, wantErr: []error{errHandler, valkeystream.ErrPublisherClosed},
			wantErrText: `dead-letter topic "dead"`, wantTopic: "dead"},
		{name: "unknown topic is an error", config: valkeystream.DeadLetterConfig{MaxDeliveries: 1}, msg: delivered(1),
			handler: failing, wantErr: []error{errHandler}, wantErrText: "set DeadLetterConfig.Topic"},
		{name: "a closing subscription is not the message's fault", config: valkeystream.DeadLetterConfig{MaxDeliveries: 1, Topic: "dead"},
			msg: delivered(1), closing: true, handler: failing, wantErr: []error{errHandler}},
		{name: "nor is a subscription's deadline", config: valkeystream.DeadLetterConfig{MaxDeliveries: 1, Topic: "dead"},
			msg: delivered(1), expires: true, handler: failing, wantErr: []error{errHandler}},
		{name: "past the crash limit the handler does not run", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3, CrashLimit: 5, Topic: "dead"},
			msg: delivered(6), handler: mustNotRun, wantTopic: "dead", wantDeadErr: "delivered 6 times, more than CrashLimit 5"},
		{name: "up to the crash limit the handler runs", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3, CrashLimit: 5, Topic: "dead"},
			msg: delivered(5), handler: failing, wantTopic: "dead"},
		{name: "past the crash limit a failed publish is a failure", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3, CrashLimit: 5, Topic: "dead"},
			msg: delivered(6), handler: mustNotRun, publishErr: valkeystream.ErrPublisherClosed,
			wantErr: []error{valkeystream.ErrDeliveryLimit, valkeystream.ErrPublisherClosed}, wantTopic: "dead", wantDeadErr: "more than CrashLimit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &recordingPublisher{err: tt.publishErr}
			tt.config.Publisher = pub
			mw, err := valkeystream.DeadLetter(tt.config, nil)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			if tt.expires {
				ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
			}
			defer cancel()
			tt.msg.SetContext(ctx)
			handler := tt.handler
			if tt.expires {
				handler = func(msg *message.Message) ([]*message.Message, error) {
					<-msg.Context().Done()
					return tt.handler(msg)
				}
			}
			if tt.closing {
				handler = func(msg *message.Message) ([]*message.Message, error) {
					cancel()
					return tt.handler(msg)
				}
			}

			produced, err := mw(handler)(tt.msg)
			assert.Empty(t, produced)
			if len(tt.wantErr) == 0 {
				assert.NoError(t, err)
			}
			for _, want := range tt.wantErr {
				assert.ErrorIs(t, err, want)
			}
			if tt.wantErrText != "" {
				assert.ErrorContains(t, err, tt.wantErrText)
			}
			if tt.wantTopic == "" {
				assert.Empty(t, pub.msgs, "nothing must be published")
				return
			}
			require.Len(t, pub.msgs, 1)
			assert.Equal(t, []string{tt.wantTopic}, pub.topics)
			dead := pub.msgs[0]
			assert.Equal(t, tt.msg.UUID, dead.UUID)
			if tt.wantDeadErr == "" {
				assert.Equal(t, errHandler.Error(), dead.Metadata.Get(valkeystream.MetadataError))
			} else {
				assert.Contains(t, dead.Metadata.Get(valkeystream.MetadataError), tt.wantDeadErr)
			}
			assert.Equal(t, tt.msg.Metadata.Get(valkeystream.MetadataDeliveryCount), dead.Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
			assert.Equal(t, "1-0", dead.Metadata.Get(valkeystream.MetadataOriginalEntryID))
			assert.NotContains(t, dead.Metadata, valkeystream.MetadataDeliveryCount)
			assert.NotContains(t, tt.msg.Metadata, valkeystream.MetadataError, "the delivered message is left as it is")
		})
	}
}

func TestDeliveryLimitRules(t *testing.T) {
	limit, err := valkeystream.DeliveryLimit(3)
	require.NoError(t, err)

	below := delivered(2)
	_, err = limit(failing)(below)
	assert.Equal(t, errHandler, err, "below the limit the handler's error passes unchanged")
	assert.NotContains(t, below.Metadata, valkeystream.MetadataError)

	at := delivered(3)
	_, err = limit(failing)(at)
	assert.ErrorIs(t, err, valkeystream.ErrDeliveryLimit)
	assert.ErrorIs(t, err, errHandler)
	assert.Equal(t, errHandler.Error(), at.Metadata.Get(valkeystream.MetadataError))
	assert.Equal(t, "3", at.Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
	assert.Equal(t, "orders", at.Metadata.Get(valkeystream.MetadataOriginalStream))
	assert.Equal(t, "3", at.Metadata.Get(valkeystream.MetadataDeliveryCount), "the delivered message keeps its delivery keys")

	_, err = limit(failing)(delivered(0))
	assert.Equal(t, errHandler, err, "a message without a delivery count is never marked")

	_, err = limit(func(*message.Message) ([]*message.Message, error) { return nil, nil })(delivered(9))
	assert.NoError(t, err)
}

func TestDeadLetterConfigValidate(t *testing.T) {
	pub := &recordingPublisher{}
	tests := []struct {
		name   string
		config valkeystream.DeadLetterConfig
		want   string
	}{
		{name: "no publisher", config: valkeystream.DeadLetterConfig{MaxDeliveries: 3}, want: "Publisher is required"},
		{name: "no max deliveries", config: valkeystream.DeadLetterConfig{Publisher: pub}, want: "MaxDeliveries is 0"},
		{name: "negative max deliveries", config: valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: -1}, want: "MaxDeliveries is -1"},
		{name: "suffix that turns dead letters off", config: valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 3, Suffix: valkeystream.NoDeadLetter},
			want: "Suffix"},
		{name: "crash limit not above max deliveries", config: valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 3, CrashLimit: 3},
			want: "CrashLimit is 3: it must be 0 (off) or greater than MaxDeliveries (3)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.config.Validate()
			assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
			mw, err := valkeystream.DeadLetter(tt.config, nil)
			assert.Nil(t, mw)
			assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
		})
	}
	assert.NoError(t, valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 1}.Validate())

	for _, n := range []int{0, -2} {
		mw, err := valkeystream.DeliveryLimit(n)
		assert.Nil(t, mw)
		assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
		assert.ErrorContains(t, err, fmt.Sprintf("maxDeliveries is %d", n))
	}
}

// A DeadLetterConfig.Suffix equal to the Subscriber's DeadLetterSuffix puts
// both kinds of dead letter of a topic in one stream.
func TestDeadLetterSuffixFollowsTheSubscriber(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	const suffix = ":failed"
	require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{"foo", "bar"}}).Err())
	failing := message.NewMessage(watermill.NewUUID(), []byte("order 8"))
	require.NoError(t, e.publisher().Publish(e.topic, failing))

	sub := e.subscriber("g", "worker", fastRedelivery, func(c *valkeystream.SubscriberConfig) { c.DeadLetterSuffix = suffix })
	e.runRouter(sub, func(*message.Message) error { return errors.New("card declined") },
		e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 1, Suffix: suffix}))

	waitUntil(t, "both dead-lettered and acknowledged", func() bool {
		return len(e.stored(e.topic+suffix)) == 2 && e.pendingCount(e.topic, "g") == 0
	})
	errs := []string{}
	for _, m := range e.stored(e.topic + suffix) {
		errs = append(errs, m.Metadata.Get(valkeystream.MetadataError))
	}
	assert.Contains(t, errs, "card declined")
	assert.Zero(t, e.client.Exists(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix).Val(), "nothing goes to the default suffix")
}
