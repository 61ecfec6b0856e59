package valkeystream_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestTrimmedPendingEntriesAreAckedNotDelivered(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	e.publish(3)
	e.readAs("g", "c", 3)
	require.NoError(t, e.client.XTrimMaxLen(ctx, e.topic, 0).Err())
	fresh := e.publish(1)

	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	got := receive(t, msgs)
	assert.Equal(t, fresh[0].UUID, got.UUID, "only the entry that still exists is delivered")
	got.Ack()
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(3), sub.Stats().MissingBodies)
	assert.Empty(t, e.pending("g"))
}

func TestDeletedEntriesOnReclaimAndNack(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	sent := e.publish(3)
	e.readAs("g", "dead", 3)
	require.NoError(t, e.client.XDel(ctx, e.topic, receiveEntryID(t, e, sent[1].UUID)).Err())

	// Full batches: the first claim takes all three (a byte-bounded claim
	// takes one until it has seen an entry's size).
	peer := e.subscriber("g", "peer", shortClaim, fullBatches)
	msgs := e.subscribe(peer)
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)
	// The claimed entry whose body is gone was settled before the reclaimed
	// batch was delivered, on every server: Redis 7 and Valkey report its id,
	// Redis 6.2 a bare null, and the loop then lists its own pending list.
	assert.Equal(t, int64(1), peer.Stats().MissingBodies, "the bodiless entry is settled before the batch is delivered")
	for _, p := range e.pending("g") {
		if p.ID == m.Metadata.Get(valkeystream.MetadataEntryID) {
			assert.Equal(t, int64(valkeystream.DeliveryCount(m)), p.RetryCount, "the delivered count is the server's")
		}
	}
	// The body of a nacked entry vanishes before it is delivered again.
	require.NoError(t, e.client.XDel(ctx, e.topic, m.Metadata.Get(valkeystream.MetadataEntryID)).Err())
	m.Nack()
	m = receive(t, msgs)
	assert.Equal(t, sent[2].UUID, m.UUID)
	m.Ack()
	require.NoError(t, peer.Close())
	assert.Equal(t, int64(2), peer.Stats().MissingBodies)
	assert.Empty(t, e.pending("g"))
}

func TestUndecodableEntryIsMovedAsideAndTheLoopGoesOn(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	badID, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{"foo", "bar"}}).Result()
	require.NoError(t, err)
	good := e.publish(1)

	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	got := receive(t, msgs)
	assert.Equal(t, good[0].UUID, got.UUID)
	got.Ack()
	require.NoError(t, sub.Close())

	moved, err := e.client.XRange(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, moved, 1)
	dead, err := valkeystream.DefaultMarshaler{}.Unmarshal(moved[0].Values)
	require.NoError(t, err, "the dead letter of an undecodable entry is a message")
	assert.Equal(t, "bar", dead.Metadata.Get("foo"), "the raw fields are kept")
	assert.Contains(t, dead.Metadata.Get(valkeystream.MetadataError), `no "uuid" field`)
	assert.Equal(t, badID, dead.Metadata.Get(valkeystream.MetadataOriginalEntryID))
	assert.Equal(t, e.topic, dead.Metadata.Get(valkeystream.MetadataOriginalStream))
	assert.Equal(t, "g", dead.Metadata.Get(valkeystream.MetadataOriginalGroup))
	assert.Empty(t, e.pending("g"), "the undecodable entry is acknowledged once it is copied")
	assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
}

func TestUndecodableEntryStaysPendingWhenItCannotBeMoved(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	require.NoError(t, e.client.Set(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix, "occupied", 0).Err())
	_, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{"foo", "bar"}}).Result()
	require.NoError(t, err)
	good := e.publish(1)

	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	got := receive(t, msgs)
	assert.Equal(t, good[0].UUID, got.UUID, "one bad entry never stops the loop")
	got.Ack()
	require.NoError(t, sub.Close())
	p := e.pending("g")
	require.Len(t, p, 1, "an entry that could not be moved aside is never lost")
	assert.Equal(t, int64(0), sub.Stats().InvalidEntries)
}

// sloppyUnmarshaler returns neither a message nor an error for entries whose
// uuid is "nothing", and messages without a metadata map for the others.
type sloppyUnmarshaler struct{}

func (sloppyUnmarshaler) Unmarshal(fields map[string]any) (*message.Message, error) {
	if fields[valkeystream.FieldUUID] == "nothing" {
		return nil, nil
	}
	msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(fields)
	if msg != nil {
		msg.Metadata = nil
	}
	return msg, err
}

// A faulty Unmarshaler does not crash the subscription: an entry it returns
// nothing for is undecodable (dead-lettered with a group), and a message
// without a metadata map still gets the delivery metadata.
func TestFaultyUnmarshalerDoesNotCrashTheSubscription(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	for _, group := range []string{"g", ""} {
		t.Run("group="+group, func(t *testing.T) {
			e := newEnv(t)
			require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic,
				Values: []any{valkeystream.FieldUUID, "nothing", valkeystream.FieldPayload, ""}}).Err())
			sent := e.publish(1)
			sub := e.subscriber(group, "c", func(c *valkeystream.SubscriberConfig) { c.Unmarshaler = sloppyUnmarshaler{} })
			got := receive(t, e.subscribe(sub))
			assert.Equal(t, sent[0].UUID, got.UUID)
			assert.Equal(t, 1, valkeystream.DeliveryCount(got))
			assert.Equal(t, e.topic, got.Metadata.Get(valkeystream.MetadataStream))
			got.Ack()
			require.NoError(t, sub.Close())
			assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
			if group != "" {
				assert.Equal(t, int64(1), e.client.XLen(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix).Val(),
					"the entry is dead-lettered")
				assert.Empty(t, e.pending(group))
			}
		})
	}
}

// panickingUnmarshaler panics on entries whose uuid is "boom".
type panickingUnmarshaler struct{}

func (panickingUnmarshaler) Unmarshal(fields map[string]any) (*message.Message, error) {
	if fields[valkeystream.FieldUUID] == "boom" {
		panic("unmarshaler bug")
	}
	return valkeystream.DefaultMarshaler{}.Unmarshal(fields)
}

// A panicking Unmarshaler neither crashes the process nor ends the
// subscription: the entry is undecodable, dead-lettered with the panic as its
// error (with a group) or skipped (fan-out).
func TestPanickingUnmarshalerMakesAnUndecodableEntry(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	for _, group := range []string{"g", ""} {
		t.Run("group="+group, func(t *testing.T) {
			e := newEnv(t)
			require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic,
				Values: []any{valkeystream.FieldUUID, "boom", valkeystream.FieldPayload, ""}}).Err())
			sent := e.publish(1)
			sub := e.subscriber(group, "c", func(c *valkeystream.SubscriberConfig) { c.Unmarshaler = panickingUnmarshaler{} })
			got := receive(t, e.subscribe(sub))
			assert.Equal(t, sent[0].UUID, got.UUID)
			got.Ack()
			require.NoError(t, sub.Close())
			assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
			if group == "" {
				return
			}
			dead := e.stored(e.topic + valkeystream.DefaultDeadLetterSuffix)
			require.Len(t, dead, 1, "the entry is dead-lettered")
			assert.Contains(t, dead[0].Metadata.Get(valkeystream.MetadataError), "panicked: unmarshaler bug")
			assert.Empty(t, e.pending(group))
		})
	}
}

func TestNoDeadLetterAcknowledgesUndecodableEntries(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{"foo", "bar"}}).Err())
	good := e.publish(1)
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.DeadLetterSuffix = valkeystream.NoDeadLetter })
	got := receive(t, e.subscribe(sub))
	assert.Equal(t, good[0].UUID, got.UUID)
	got.Ack()
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
	assert.Empty(t, e.pending("g"), "the undecodable entry is acknowledged")
	keys, err := e.client.Keys(ctx, e.topic+"*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{e.topic}, keys, "no dead-letter stream is written")
}
