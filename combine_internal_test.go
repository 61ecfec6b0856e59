package valkeystream

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// gate holds the first round trip carrying XADD until it is opened, and
// counts the round trips that carry XADD.
type gate struct {
	open       chan struct{}
	held       chan struct{} // closed when the first round trip is held
	once       sync.Once
	roundTrips atomic.Int64
}

func (g *gate) wait(cmds []redis.Cmder) {
	for _, c := range cmds {
		if c.Name() == "xadd" {
			g.roundTrips.Add(1)
			g.once.Do(func() {
				close(g.held)
				<-g.open
			})
			return
		}
	}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.wait([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.wait(cmds)
		return next(ctx, cmds)
	}
}

var _ redis.Hook = (*gate)(nil)

// Calls that arrive while a round trip is in progress go together in the
// next one, each with its own outcome: a call whose context ended meanwhile
// writes nothing, and a call to a key of the wrong type fails alone.
func TestConcurrentPublishesShareARoundTrip(t *testing.T) {
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 8})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	topic, wrong := "combine-"+watermill.NewShortUUID(), "combine-string-"+watermill.NewShortUUID()
	require.NoError(t, client.Set(ctx, wrong, "not a stream", 0).Err())
	g := &gate{open: make(chan struct{}), held: make(chan struct{})}
	client.AddHook(g)
	pub, err := NewPublisher(PublisherConfig{Client: client}, nil)
	require.NoError(t, err)

	first := make(chan error, 1)
	go func() { first <- pub.Publish(topic, message.NewMessage("first", []byte("x"))) }()
	<-g.held

	const queued = 10
	cancelled, cancel := context.WithCancel(ctx)
	results := make([]chan error, queued)
	for i := range queued {
		results[i] = make(chan error, 1)
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		to := topic
		switch i {
		case 3:
			msg.SetContext(cancelled)
		case 6:
			to = wrong
		}
		go func() { results[i] <- pub.Publish(to, msg) }()
	}
	require.Eventually(t, func() bool {
		pub.combiner.mu.Lock()
		defer pub.combiner.mu.Unlock()
		return len(pub.combiner.waiting) == queued
	}, 10*time.Second, time.Millisecond, "the calls queue behind the round trip in progress")
	cancel()
	close(g.open)

	require.NoError(t, <-first)
	for i, res := range results {
		err := <-res
		switch i {
		case 3:
			assert.ErrorIs(t, err, context.Canceled, "call %d", i)
		case 6:
			var pubErr *PublishError
			require.ErrorAs(t, err, &pubErr, "call %d", i)
			assert.True(t, redis.HasErrorPrefix(pubErr.Err, "WRONGTYPE"), "got %v", pubErr.Err)
		default:
			assert.NoError(t, err, "call %d", i)
		}
	}
	assert.Equal(t, int64(2), g.roundTrips.Load(), "one round trip for the first call, one for all that queued")
	entries, err := client.XRange(ctx, topic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, queued-1, "the first call and every queued call but the cancelled one and the misdirected one")
	assert.Equal(t, "first", entries[0].Values[FieldUUID])
	assert.Empty(t, pub.combiner.waiting)
	assert.False(t, pub.combiner.leading, "the lead ends with the last round trip")
}

// Many goroutines publishing at once lose nothing and leave no call waiting.
func TestManyConcurrentPublishers(t *testing.T) {
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 16})
	t.Cleanup(func() { _ = client.Close() })
	pub, err := NewPublisher(PublisherConfig{Client: client}, nil)
	require.NoError(t, err)
	topic := "combine-" + watermill.NewShortUUID()
	const goroutines, calls = 64, 30
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range calls {
				msgs := make([]*message.Message, 1+i%3)
				for j := range msgs {
					msgs[j] = message.NewMessage(watermill.NewUUID(), []byte("x"))
				}
				assert.NoError(t, pub.Publish(topic, msgs...))
			}
		})
	}
	wg.Wait()
	want := int64(goroutines * (calls / 3) * (1 + 2 + 3))
	assert.Equal(t, want, client.XLen(context.Background(), topic).Val())
	assert.False(t, pub.combiner.leading)
}
