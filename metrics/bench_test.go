package metrics_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

// The benchmarks compare consuming and publishing without metrics and with
// a Collector registered and scraped every scrapeEvery, far more often than
// Prometheus does (15 s to 1 min), with a sample of the server on every
// scrape, so that the cost shows.
const scrapeEvery = 100 * time.Millisecond

// scrape registers c and gathers it every scrapeEvery until the benchmark
// ends.
func scrape(b *testing.B, c *metrics.Collector) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(scrapeEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if _, err := reg.Gather(); err != nil {
					b.Error(err)
				}
			case <-stop:
				return
			}
		}
	}()
	b.Cleanup(func() { close(stop); wg.Wait() })
}

type benchSetup struct {
	client *redis.Client
	pub    *valkeystream.Publisher
	sub    *valkeystream.Subscriber
}

func setup(b *testing.B, withMetrics bool) benchSetup {
	srv := testserver.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64})
	b.Cleanup(func() { _ = client.Close() })
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		b.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "bench", Start: valkeystream.StartHead,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Close() })
	if withMetrics {
		c, err := metrics.NewCollector(metrics.Config{Client: client, SampleInterval: scrapeEvery})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.AddPublisher("bench", pub); err != nil {
			b.Fatal(err)
		}
		if err := c.AddSubscriber("bench", sub); err != nil {
			b.Fatal(err)
		}
		scrape(b, c)
	}
	return benchSetup{client, pub, sub}
}

var modes = []struct {
	name    string
	metrics bool
}{{"without-metrics", false}, {"with-metrics", true}}

// BenchmarkConsume receives and acks b.N pre-published messages through a
// consumer group.
func BenchmarkConsume(b *testing.B) {
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			s := setup(b, mode.metrics)
			topic := "bench-" + watermill.NewShortUUID()
			batch := make([]*message.Message, 0, 1000)
			for i := range b.N {
				batch = append(batch, message.NewMessage(watermill.NewUUID(), []byte("0123456789abcdef")))
				if len(batch) == cap(batch) || i == b.N-1 {
					if err := s.pub.Publish(topic, batch...); err != nil {
						b.Fatal(err)
					}
					batch = batch[:0]
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			msgs, err := s.sub.Subscribe(context.Background(), topic)
			if err != nil {
				b.Fatal(err)
			}
			for range b.N {
				(<-msgs).Ack()
			}
		})
	}
}

// BenchmarkPublish publishes one message per call from 64 goroutines.
func BenchmarkPublish(b *testing.B) {
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			s := setup(b, mode.metrics)
			topic := "bench-" + watermill.NewShortUUID()
			if mode.metrics {
				s.sub.Subscribe(context.Background(), topic) // so the stream and group are sampled
			}
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				msg := message.NewMessage(watermill.NewUUID(), []byte("0123456789abcdef"))
				for pb.Next() {
					if err := s.pub.Publish(topic, msg); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkScrape measures one scrape of a Collector with one Subscriber,
// one Publisher and the group the Subscriber reads (8 consumers): with a
// sample of the server each time, and answered from the last sample. Its
// cost divided by the scrape interval is the share of a core the metrics
// take.
func BenchmarkScrape(b *testing.B) {
	for _, sampled := range []bool{true, false} {
		name := map[bool]string{true: "sampling-the-server", false: "from-the-last-sample"}[sampled]
		b.Run(name, func(b *testing.B) {
			s := setup(b, false)
			ctx := context.Background()
			topic := "bench-" + watermill.NewShortUUID()
			if _, err := s.sub.Subscribe(ctx, topic); err != nil {
				b.Fatal(err)
			}
			for i := range 8 {
				s.client.XGroupCreateConsumer(ctx, topic, "bench", "c"+string(rune('0'+i)))
			}
			interval := time.Hour
			if sampled {
				interval = time.Nanosecond
			}
			c, err := metrics.NewCollector(metrics.Config{Client: s.client, SampleInterval: interval})
			if err != nil {
				b.Fatal(err)
			}
			c.AddSubscriber("bench", s.sub)
			c.AddPublisher("bench", s.pub)
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			if _, err := reg.Gather(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
