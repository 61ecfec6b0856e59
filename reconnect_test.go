package valkeystream_test

import (
	"context"
	"sync"
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

// TestReconnect restarts the server twice (SIGKILL, then a restart that
// replays the append-only file) while 100 publishers write 10 000 messages,
// one per call, and one subscription consumes them. Every message whose
// Publish returned nil must be delivered. Shipped default timings throughout.
func TestReconnect(t *testing.T) {
	testserver.Parallel(t)
	for _, mode := range []struct {
		name  string
		group string
	}{{"group", "reconnect"}, {"fan-out", ""}} {
		t.Run(mode.name, func(t *testing.T) {
			srv := testserver.Start(t)
			if !srv.Restartable() {
				t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be restarted by the test")
			}
			testReconnect(t, srv, mode.group)
		})
	}
}

func testReconnect(t *testing.T, srv *testserver.Server, group string) {
	const (
		total      = 10000
		publishers = 100
	)
	topic := "reconnect-" + watermill.NewShortUUID()
	pubClient := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: publishers})
	subClient := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer pubClient.Close()
	defer subClient.Close()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: pubClient}, testLogger())
	require.NoError(t, err)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: subClient, ConsumerGroup: group, Start: valkeystream.StartHead,
	}, testLogger())
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		published = map[string]bool{}
		failures  int
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
				for {
					if err := pub.Publish(topic, msg); err == nil {
						break
					}
					mu.Lock()
					failures++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond) // the server is restarting
				}
				mu.Lock()
				published[msg.UUID] = true
				mu.Unlock()
			}
		}()
	}
	restarted := make(chan error, 2)
	go func() {
		defer close(next)
		for i := range total {
			if i == total/3 || i == total/2 {
				go func() { restarted <- srv.Restart() }()
			}
			next <- i
		}
	}()

	received := map[string]int{}
	deadline := time.After(2 * time.Minute)
	allPublished := make(chan struct{})
	go func() { wg.Wait(); close(allPublished) }()
	done := false
	for !done {
		select {
		case m, ok := <-msgs:
			require.True(t, ok, "the subscription ended")
			received[m.UUID]++
			m.Ack()
		case <-allPublished:
			allPublished = nil
		case <-deadline:
			mu.Lock()
			t.Fatalf("timed out: received %d of %d published messages", len(received), len(published))
		}
		if allPublished == nil && len(received) >= total {
			done = true
		}
	}
	for range 2 {
		require.NoError(t, <-restarted)
	}

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, published, total)
	var missing []string
	for id := range published {
		if received[id] == 0 {
			missing = append(missing, id)
		}
	}
	require.Empty(t, missing, "published messages never delivered")
	duplicates := 0
	for _, n := range received {
		duplicates += n - 1
	}
	t.Logf("%d messages, 2 restarts: %d failed publish calls retried, %d duplicate deliveries, stats %+v",
		total, failures, duplicates, sub.Stats())
}

// TestOutageBacksOffAndResumes keeps the server down for two seconds. The
// subscription must back off instead of spinning (a busy loop would fail
// thousands of times), then resume by itself and deliver what is published
// after the server is back.
func TestOutageBacksOffAndResumes(t *testing.T) {
	testserver.Parallel(t)
	for _, group := range []string{"outage", ""} {
		t.Run("group="+group, func(t *testing.T) {
			srv := testserver.Start(t)
			if !srv.Restartable() {
				t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be stopped by the test")
			}
			client := newClient(t, srv)
			pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, testLogger())
			require.NoError(t, err)
			// A client that neither retries nor redials by itself: every
			// failed call reaches the loop, so the count below measures the
			// loop's own backoff.
			subClient := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
			t.Cleanup(func() { _ = subClient.Close() })
			sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
				Client: subClient, ConsumerGroup: group, Start: valkeystream.StartHead,
			}, testLogger())
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			topic := "outage-" + watermill.NewShortUUID()
			msgs, err := sub.Subscribe(context.Background(), topic)
			require.NoError(t, err)

			before := message.NewMessage(watermill.NewUUID(), []byte("before"))
			require.NoError(t, pub.Publish(topic, before))
			require.Equal(t, before.UUID, receiveAll(t, msgs, 1)[0])

			require.NoError(t, srv.Kill())
			require.Eventually(t, func() bool { return sub.Stats().Faults >= 1 }, receiveTimeout, 10*time.Millisecond,
				"the outage must be noticed")
			first := sub.Stats().Faults
			time.Sleep(2 * time.Second) // the time is the scenario: the outage the faults are counted in
			faults := sub.Stats().Faults - first
			require.NoError(t, srv.StartAgain())
			t.Logf("failed calls in 2 s of outage after the first: %d", faults)
			assert.LessOrEqual(t, faults, int64(40), "the loop must back off")
			after := message.NewMessage(watermill.NewUUID(), []byte("after"))
			require.Eventually(t, func() bool { return pub.Publish(topic, after) == nil }, receiveTimeout, 50*time.Millisecond)
			assert.Equal(t, after.UUID, receiveAll(t, msgs, 1)[0])
		})
	}
}
