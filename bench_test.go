package valkeystream_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// BenchmarkPublish measures Publish with one message per call and with 100.
func BenchmarkPublish(b *testing.B) {
	srv := testserver.Start(b)
	client := newClient(b, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	require.NoError(b, err)
	for _, perCall := range []int{1, 100} {
		b.Run(map[int]string{1: "1-per-call", 100: "100-per-call"}[perCall], func(b *testing.B) {
			topic := "bench-" + watermill.NewShortUUID()
			msgs := newMessages(perCall)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += perCall {
				if err := pub.Publish(topic, msgs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConsume measures receiving and acking b.N pre-published messages
// through a consumer group, straight from the Subscribe channel.
func BenchmarkConsume(b *testing.B) {
	srv := testserver.Start(b)
	client := newClient(b, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	require.NoError(b, err)
	topic := "bench-" + watermill.NewShortUUID()
	batch := make([]*message.Message, 0, 1000)
	for i := 0; i < b.N; i++ {
		batch = append(batch, message.NewMessage(watermill.NewUUID(), []byte("0123456789abcdef")))
		if len(batch) == cap(batch) || i == b.N-1 {
			require.NoError(b, pub.Publish(topic, batch...))
			batch = batch[:0]
		}
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "bench", Start: valkeystream.StartHead,
	}, nil)
	require.NoError(b, err)
	defer sub.Close()
	b.ReportAllocs()
	b.ResetTimer()
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(b, err)
	for range b.N {
		(<-msgs).Ack()
	}
}
