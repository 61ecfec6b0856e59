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

// The benchmarks use the private test server, which fsyncs every write; set
// VALKEYSTREAM_TEST_ADDR to a server without persistence to measure the
// adapter rather than the disk. bench/ compares against other adapters.

// BenchmarkPublish measures Publish with one message per call and with 100,
// from one goroutine, and with one message per call from many goroutines.
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
	b.Run("1-per-call-parallel", func(b *testing.B) {
		topic := "bench-" + watermill.NewShortUUID()
		b.SetParallelism(32) // 64 goroutines on two cores
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			msg := message.NewMessage(watermill.NewUUID(), []byte("0123456789abcdef"))
			for pb.Next() {
				if err := pub.Publish(topic, msg); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// prefill publishes n messages to a new topic and returns the topic.
func prefill(b *testing.B, pub *valkeystream.Publisher, n int) string {
	b.Helper()
	topic := "bench-" + watermill.NewShortUUID()
	batch := make([]*message.Message, 0, 1000)
	for i := 0; i < n; i++ {
		batch = append(batch, message.NewMessage(watermill.NewUUID(), []byte("0123456789abcdef")))
		if len(batch) == cap(batch) || i == n-1 {
			require.NoError(b, pub.Publish(topic, batch...))
			batch = batch[:0]
		}
	}
	return topic
}

func benchSubscriber(b *testing.B) (*valkeystream.Subscriber, *valkeystream.Publisher) {
	srv := testserver.Start(b)
	client := newClient(b, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	require.NoError(b, err)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "bench", Start: valkeystream.StartHead,
	}, nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = sub.Close() })
	return sub, pub
}

// BenchmarkConsume measures receiving and acking b.N pre-published messages
// through a consumer group, straight from the Subscribe channel.
func BenchmarkConsume(b *testing.B) {
	sub, pub := benchSubscriber(b)
	topic := prefill(b, pub, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(b, err)
	for range b.N {
		(<-msgs).Ack()
	}
}

// BenchmarkConsumeRouter measures b.N pre-published messages handled through
// a Watermill router by a handler that does nothing.
func BenchmarkConsumeRouter(b *testing.B) {
	sub, pub := benchSubscriber(b)
	topic := prefill(b, pub, b.N)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(b, err)
	done := make(chan struct{})
	handled := 0
	router.AddNoPublisherHandler("bench", topic, sub, func(*message.Message) error {
		handled++ // the subscription delivers one message at a time
		if handled == b.N {
			close(done)
		}
		return nil
	})
	b.ReportAllocs()
	b.ResetTimer()
	go func() { _ = router.Run(context.Background()) }()
	<-done
	b.StopTimer()
	require.NoError(b, router.Close())
}

// benchMessage returns a typical message: a UUID, a 64-byte payload and two
// metadata keys.
func benchMessage() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), make([]byte, 64))
	msg.Metadata.Set("correlation_id", watermill.NewUUID())
	msg.Metadata.Set("content_type", "application/json")
	return msg
}

// BenchmarkMarshal measures encoding one message into entry fields.
func BenchmarkMarshal(b *testing.B) {
	msg := benchMessage()
	m := valkeystream.DefaultMarshaler{}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Marshal("topic", msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnmarshal measures decoding entry fields, as go-redis returns
// them, into a message.
func BenchmarkUnmarshal(b *testing.B) {
	msg := benchMessage()
	m := valkeystream.DefaultMarshaler{}
	encoded, err := m.Marshal("topic", msg)
	require.NoError(b, err)
	fields := make(map[string]any, len(encoded)/2)
	for i := 0; i < len(encoded); i += 2 {
		v := encoded[i+1]
		if p, ok := v.([]byte); ok {
			v = string(p) // go-redis returns every value as a string
		}
		fields[encoded[i].(string)] = v
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Unmarshal(fields); err != nil {
			b.Fatal(err)
		}
	}
}
