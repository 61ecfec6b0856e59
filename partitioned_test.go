package valkeystream_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func keyed(key string, seq int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(seq)))
	if key != "" {
		m.Metadata.Set(valkeystream.MetadataPartitionKey, key)
	}
	m.Metadata.Set("seq", fmt.Sprint(seq))
	return m
}

func TestPublishRoutesByPartitionKey(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 8
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: n} })
	var msgs []*message.Message
	for seq := range 40 {
		msgs = append(msgs, keyed(fmt.Sprint("key-", seq%10), seq))
	}
	require.NoError(t, pub.Publish(e.topic, msgs[:20]...))
	for _, m := range msgs[20:] {
		require.NoError(t, pub.Publish(e.topic, m))
	}
	streams, err := valkeystream.PartitionStreams(e.topic, n)
	require.NoError(t, err)
	total := 0
	for i, stream := range streams {
		last := map[string]int{}
		for _, m := range e.stored(stream) {
			key := m.Metadata.Get(valkeystream.MetadataPartitionKey)
			assert.Equal(t, i, valkeystream.PartitionOf(key, n), "message of key %s in partition %d", key, i)
			var seq int
			_, _ = fmt.Sscan(m.Metadata.Get("seq"), &seq)
			if prev, ok := last[key]; ok {
				assert.Greater(t, seq, prev, "key %s out of order in partition %d", key, i)
			}
			last[key] = seq
			total++
		}
	}
	assert.Equal(t, 40, total)
	n0, err := e.client.Exists(context.Background(), e.topic).Result()
	require.NoError(t, err)
	assert.Zero(t, n0, "a partitioned topic wrote its plain stream")
}

func TestPublishSpreadsUnkeyedMessages(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 4
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: n} })
	for seq := range 40 {
		require.NoError(t, pub.Publish(e.topic, keyed("", seq)))
	}
	streams, err := valkeystream.PartitionStreams(e.topic, n)
	require.NoError(t, err)
	for _, s := range streams {
		l, err := e.client.XLen(context.Background(), s).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(10), l, "unkeyed messages in %s", s)
	}
}

func TestPartitionCountMismatchIsRefused(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	eight := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: 8} })
	require.NoError(t, eight.Publish(e.topic, keyed("a", 1)))
	four := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: 4} })
	err := four.Publish(e.topic, keyed("a", 2))
	require.ErrorIs(t, err, valkeystream.ErrPartitionCount)
	assert.Contains(t, err.Error(), "8 partitions")
	assert.Contains(t, err.Error(), "with 4")
}

func TestPartitionsConfigIsValidated(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	_, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: map[string]int{"orders": 4}}, nil)
	require.NoError(t, err)
	for name, parts := range map[string]map[string]int{
		"zero":      {"orders": 0},
		"too many":  {"orders": valkeystream.MaxPartitions + 1},
		"hash tag":  {"{orders}": 4},
		"empty key": {"": 4},
	} {
		_, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: parts}, nil)
		assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig, name)
		assert.ErrorContains(t, err, "Partitions", name)
	}
}
