package valkeystream_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestFanOutDeliversEveryEntryToEverySubscriber(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	newSub := func(start valkeystream.StartPosition) <-chan *message.Message {
		sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: e.client, Start: start}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return e.subscribe(sub)
	}
	old := e.publish(1)
	a, b := newSub(valkeystream.StartNew), newSub(valkeystream.StartNew)
	head := newSub(valkeystream.StartHead)
	fresh := e.publish(3)

	assert.Equal(t, uuidsOf(fresh), receiveAll(t, a, 3))
	assert.Equal(t, uuidsOf(fresh), receiveAll(t, b, 3))
	assert.Equal(t, append(uuidsOf(old), uuidsOf(fresh)...), receiveAll(t, head, 4))

	// A Nack in fan-out delivers the same message again.
	more := e.publish(1)
	m := receive(t, a)
	require.Equal(t, more[0].UUID, m.UUID)
	m.Nack()
	again := receive(t, a)
	assert.Equal(t, more[0].UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()

	// Group and consumer are empty in fan-out, whatever the publisher wrote
	// under those keys (a message passed on by a poison queue, say).
	passedOn := message.NewMessage(watermill.NewUUID(), []byte("x"))
	passedOn.Metadata.Set(valkeystream.MetadataGroup, "orders")
	passedOn.Metadata.Set(valkeystream.MetadataConsumer, "host-a")
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, passedOn))
	got := receive(t, b)
	require.Equal(t, more[0].UUID, got.UUID, "b has not read this one yet")
	got.Ack()
	got = receive(t, b)
	require.Equal(t, passedOn.UUID, got.UUID)
	assert.Empty(t, got.Metadata.Get(valkeystream.MetadataGroup))
	assert.Empty(t, got.Metadata.Get(valkeystream.MetadataConsumer))
	got.Ack()

	_, err = e.client.XInfoGroups(context.Background(), e.topic).Result()
	assert.NoError(t, err)
	assert.Empty(t, e.client.XInfoGroups(context.Background(), e.topic).Val(), "fan-out creates no group")
}

// Each fan-out subscription holds a connection of the client while its
// read blocks: a Subscriber whose fan-out subscriptions come to hold the
// whole pool says so once, at Error, naming PoolSize, since the client's
// other commands then wait for a read to time out. Below the pool it says
// nothing.
func TestFanOutSubscriptionsHoldingThePoolAreLogged(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	client := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), PoolSize: 3})
	t.Cleanup(func() { _ = client.Close() })
	logger := watermill.NewCaptureLogger()
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, Start: valkeystream.StartNew}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	poolLines := func() (n int) {
		for _, l := range logger.Captured()[watermill.ErrorLogLevel] {
			if strings.Contains(l.Msg, "PoolSize") {
				n++
			}
		}
		return n
	}
	for i := range 2 {
		e.subscribeTo(sub, fmt.Sprintf("%s-%d", e.topic, i))
	}
	assert.Zero(t, poolLines(), "two fan-out subscriptions on a pool of three")
	for i := 2; i < 4; i++ {
		e.subscribeTo(sub, fmt.Sprintf("%s-%d", e.topic, i))
	}
	assert.Equal(t, 1, poolLines(), "four fan-out subscriptions on a pool of three: one line")
}
