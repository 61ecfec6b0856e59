package valkeystream_test

import (
	"context"
	"fmt"
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

// roundTrips counts the round trips that carry XADD: single commands and
// pipelines (connection handshakes are left out).
type roundTrips struct{ single, pipelines, pipelined atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "xadd" {
			r.single.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if c.Name() == "xadd" {
				n++
			}
		}
		if n > 0 {
			r.pipelines.Add(1)
			r.pipelined.Add(int64(n))
		}
		return next(ctx, cmds)
	}
}

func newMessages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
	}
	return msgs
}

func TestPublishSendsOneCallInOneRoundTrip(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	counter := &roundTrips{}
	e.client.AddHook(counter)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)

	msgs := newMessages(100)
	require.NoError(t, pub.Publish(e.topic, msgs...))
	assert.Equal(t, int64(1), counter.pipelines.Load())
	assert.Equal(t, int64(100), counter.pipelined.Load())
	assert.Equal(t, int64(0), counter.single.Load())

	entries, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 100)
	for i, en := range entries {
		assert.Equal(t, msgs[i].UUID, en.Values[valkeystream.FieldUUID], "entries keep the call's order")
	}
}

func TestPublishErrorNamesTheMessagesNotWritten(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	require.NoError(t, e.client.Set(context.Background(), e.topic, "not a stream", 0).Err())
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	msgs := newMessages(3)

	err = pub.Publish(e.topic, msgs...)
	var pubErr *valkeystream.PublishError
	require.ErrorAs(t, err, &pubErr)
	assert.Equal(t, uuidsOf(msgs), pubErr.NotSent)
	assert.Equal(t, 3, pubErr.Total)
	assert.ErrorContains(t, err, "WRONGTYPE")
	assert.ErrorContains(t, err, msgs[2].UUID)
}

func TestPublishRejectsAnInvalidMessageBeforeSendingAny(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	msgs := newMessages(2)
	msgs[1].Metadata.Set(valkeystream.FieldPayload, "clash")

	err = pub.Publish(e.topic, msgs...)
	assert.ErrorIs(t, err, valkeystream.ErrInvalidMessage)
	var pubErr *valkeystream.PublishError
	require.ErrorAs(t, err, &pubErr)
	assert.Equal(t, uuidsOf(msgs), pubErr.NotSent)
	assert.Zero(t, e.client.Exists(context.Background(), e.topic).Val(), "nothing is written")
}

func TestPublishUsesTheMessageContext(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	msgs := newMessages(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs[1].SetContext(ctx)

	err = pub.Publish(e.topic, msgs...)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, e.client.XLen(context.Background(), e.topic).Val())
}

func TestPublishRetention(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	// Approximate trimming removes whole nodes only; one entry per node makes
	// it exact on this private server.
	prev, err := e.client.ConfigGet(ctx, "stream-node-max-entries").Result()
	require.NoError(t, err)
	require.NoError(t, e.client.ConfigSet(ctx, "stream-node-max-entries", "1").Err())
	t.Cleanup(func() { // the server may be a shared one (VALKEYSTREAM_TEST_ADDR)
		_ = e.client.ConfigSet(context.Background(), "stream-node-max-entries", prev["stream-node-max-entries"]).Err()
	})
	ageTopic := e.topic + "-age"
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: e.client,
		Retention: map[string]valkeystream.Retention{
			e.topic:  {MaxLen: 10},
			ageTopic: {MaxAge: time.Hour},
		},
	}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, newMessages(25)...))
	assert.Equal(t, int64(10), e.client.XLen(ctx, e.topic).Val())

	old := time.Now().Add(-2 * time.Hour).UnixMilli()
	for i := range 2 {
		require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: ageTopic, ID: fmt.Sprintf("%d-%d", old, i),
			Values: []any{"uuid", "old", "payload", ""}}).Err())
	}
	fresh := newMessages(1)
	require.NoError(t, pub.Publish(ageTopic, fresh...))
	entries, err := e.client.XRange(ctx, ageTopic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1, "entries older than MaxAge are trimmed")
	assert.Equal(t, fresh[0].UUID, entries[0].Values["uuid"])
}

// A MaxAge that reaches back before 1970 ("keep for a century") trims
// nothing, and publishing works.
func TestPublishRetentionOlderThanTheEpochTrimsNothing(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client:    e.client,
		Retention: map[string]valkeystream.Retention{e.topic: {MaxAge: 100 * 365 * 24 * time.Hour}},
	}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, newMessages(3)...))
	assert.Equal(t, int64(3), e.client.XLen(context.Background(), e.topic).Val())
}

// The Publisher keeps its own copy of Retention: the caller's later changes
// to the map neither apply nor race with Publish.
func TestPublisherKeepsItsOwnRetention(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	retention := map[string]valkeystream.Retention{e.topic: {MaxLen: 1000}}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client, Retention: retention}, nil)
	require.NoError(t, err)
	retention[e.topic] = valkeystream.Retention{MaxLen: 1}
	require.NoError(t, pub.Publish(e.topic, newMessages(5)...))
	assert.Equal(t, int64(5), e.client.XLen(context.Background(), e.topic).Val())
}

func TestPublishAfterClose(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Close())
	require.NoError(t, pub.Close())
	assert.ErrorIs(t, pub.Publish(e.topic, newMessages(1)...), valkeystream.ErrPublisherClosed)
	assert.NoError(t, e.client.Ping(context.Background()).Err(), "the client stays open without CloseClient")
}
