package valkeystream_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// BenchmarkPublishWaitReplicas measures what WaitReplicas costs with a
// healthy replica: Publish of 100 messages per call, and of one message per
// call from 64 goroutines, without WAIT and with WaitReplicas 1, against
// the master of a Sentinel group (master and replica on the same host).
func BenchmarkPublishWaitReplicas(b *testing.B) {
	g := testserver.StartSentinel(b)
	client := redis.NewClient(&redis.Options{Addr: g.DataAddrs()[0], PoolSize: 64})
	b.Cleanup(func() { _ = client.Close() })
	for _, wait := range []int{0, 1} {
		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, WaitReplicas: wait}, nil)
		require.NoError(b, err)
		name := map[int]string{0: "no-wait", 1: "wait-1"}[wait]
		b.Run(name+"/100-per-call", func(b *testing.B) {
			topic := "bench-" + watermill.NewShortUUID()
			msgs := newMessages(100)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += 100 {
				if err := pub.Publish(topic, msgs...); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/1-per-call-parallel", func(b *testing.B) {
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
}
