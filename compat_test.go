package valkeystream_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The compat module (compat/) runs the same scenarios against the real
// watermill-redisstream; these need only the server.

func TestSubscriberReadsBothLayoutsInOrder(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ours := e.publisher()
	theirs := e.publisher(func(c *valkeystream.PublisherConfig) { c.Marshaler = valkeystream.RedisstreamMarshaler{} })
	var want []*message.Message
	for i := range 20 {
		msg := message.NewMessage(fmt.Sprintf("id-%02d", i), []byte(fmt.Sprint(i)))
		if i%3 == 0 {
			msg.Metadata.Set("trace", fmt.Sprint("t", i))
		}
		pub := ours
		if i%2 == 1 {
			pub = theirs
		}
		require.NoError(t, pub.Publish(e.topic, msg))
		want = append(want, msg)
	}

	sub := e.subscriber("g", "worker", fastRedelivery)
	msgs := e.subscribe(sub)
	for i, w := range want {
		got := receive(t, msgs)
		got.Ack()
		require.Equal(t, w.UUID, got.UUID, "message %d: stream order", i)
		assert.Equal(t, string(w.Payload), string(got.Payload), "message %s payload", w.UUID)
		assert.Equal(t, w.Metadata.Get("trace"), got.Metadata.Get("trace"), "message %s metadata", w.UUID)
		assert.Equal(t, "g", got.Metadata.Get(valkeystream.MetadataGroup), "message %s: the delivery keys are set for both layouts", w.UUID)
	}
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(0), sub.Stats().InvalidEntries)
	assert.Equal(t, int64(0), e.pendingCount(e.topic, "g"))
}

func TestMalformedIncumbentEntryIsDeadLetteredWithItsUUID(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	bad, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{
		"_watermill_message_uuid", "old-1", "payload", "kept", "metadata", "\x82\xa1a\xa11"}}).Result() // one pair short
	require.NoError(t, err)
	good := message.NewMessage("new-1", []byte("fine"))
	require.NoError(t, e.publisher(func(c *valkeystream.PublisherConfig) { c.Marshaler = valkeystream.RedisstreamMarshaler{} }).
		Publish(e.topic, good))

	sub := e.subscriber("g", "worker", fastRedelivery)
	got := receive(t, e.subscribe(sub))
	got.Ack()
	assert.Equal(t, good.UUID, got.UUID, "the loop goes on past the malformed entry")
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
	assert.Equal(t, int64(0), e.pendingCount(e.topic, "g"))

	dead, err := e.subscriber("dead-readers", "r").Subscribe(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix)
	require.NoError(t, err)
	letter := receive(t, dead)
	letter.Ack()
	assert.Equal(t, "old-1", letter.UUID, "the dead letter keeps the UUID its publisher stored")
	assert.Equal(t, "kept", string(letter.Payload))
	assert.Equal(t, "\x82\xa1a\xa11", letter.Metadata.Get("metadata"), "the raw metadata field is kept")
	assert.Equal(t, bad, letter.Metadata.Get(valkeystream.MetadataOriginalEntryID))
	assert.Contains(t, letter.Metadata.Get(valkeystream.MetadataError), "not a MessagePack map of strings")
}

// BenchmarkUnmarshalRedisstream measures decoding an entry in
// watermill-redisstream's layout (compare with BenchmarkUnmarshal, the same
// message in the default layout).
func BenchmarkUnmarshalRedisstream(b *testing.B) {
	encoded, err := valkeystream.RedisstreamMarshaler{}.Marshal("topic", benchMessage())
	require.NoError(b, err)
	fields := make(map[string]any, len(encoded)/2)
	for i := 0; i < len(encoded); i += 2 {
		v := encoded[i+1]
		if p, ok := v.([]byte); ok {
			v = string(p) // go-redis returns every value as a string
		}
		fields[encoded[i].(string)] = v
	}
	m := valkeystream.DefaultMarshaler{}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Unmarshal(fields); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarshalRedisstream measures encoding a message in
// watermill-redisstream's layout (compare with BenchmarkMarshal).
func BenchmarkMarshalRedisstream(b *testing.B) {
	msg := benchMessage()
	m := valkeystream.RedisstreamMarshaler{}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Marshal("topic", msg); err != nil {
			b.Fatal(err)
		}
	}
}
