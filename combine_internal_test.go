package valkeystream

import (
	"context"
	"fmt"
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

// gate holds the first maxLeaders round trips carrying XADD, and counts the
// round trips that carry XADD. A send on open lets one held round trip go;
// closing it lets them all go.
type gate struct {
	open       chan struct{}
	held       chan struct{} // closed when maxLeaders round trips are held
	holding    atomic.Int32
	roundTrips atomic.Int64
}

func (g *gate) wait(cmds []redis.Cmder) {
	for _, c := range cmds {
		if c.Name() == "xadd" {
			g.roundTrips.Add(1)
			if n := g.holding.Add(1); n <= maxLeaders {
				if n == maxLeaders {
					close(g.held)
				}
				<-g.open
			}
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

// gatedPublisher returns a Publisher whose first maxLeaders round trips
// carrying XADD are held by the returned gate.
func gatedPublisher(t *testing.T) (*Publisher, *redis.Client, *gate) {
	t.Helper()
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 8})
	t.Cleanup(func() { _ = client.Close() })
	g := &gate{open: make(chan struct{}), held: make(chan struct{})}
	client.AddHook(g)
	pub, err := NewPublisher(PublisherConfig{Client: client}, nil)
	require.NoError(t, err)
	return pub, client, g
}

// queued waits until n calls queue for key behind the round trip in
// progress.
func queued(t *testing.T, pub *Publisher, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		pub.combiners.mu.Lock()
		c := pub.combiners.byKey[key]
		pub.combiners.mu.Unlock()
		if c == nil {
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.waiting) == n
	}, 10*time.Second, time.Millisecond, "%d calls queue behind the round trip in progress", n)
}

// holdLeaders starts maxLeaders calls for topic and returns once the gate
// holds their round trips; receive their outcomes from the channels.
func holdLeaders(pub *Publisher, g *gate, topic string) []chan error {
	var results []chan error
	for i := range maxLeaders {
		results = append(results, publishAsync(pub, topic, message.NewMessage(fmt.Sprint("leader-", i), []byte("x"))))
	}
	<-g.held
	return results
}

func publishAsync(pub *Publisher, topic string, msg *message.Message) chan error {
	res := make(chan error, 1)
	go func() { res <- pub.Publish(topic, msg) }()
	return res
}

// Calls that arrive while a round trip is in progress go together in the
// next one, each with its own outcome: a call whose context ended while it
// was queued writes nothing.
func TestConcurrentPublishesShareARoundTrip(t *testing.T) {
	testserver.Parallel(t)
	pub, client, g := gatedPublisher(t)
	ctx := context.Background()
	topic := "combine-" + watermill.NewShortUUID()
	leaders := holdLeaders(pub, g, topic)

	const calls = 10
	cancelled, cancel := context.WithCancel(ctx)
	results := make([]chan error, calls)
	for i := range calls {
		msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
		if i == 3 {
			msg.SetContext(cancelled)
		}
		results[i] = publishAsync(pub, topic, msg)
	}
	queued(t, pub, topic, calls)
	cancel()
	assert.ErrorIs(t, <-results[3], context.Canceled, "a queued call whose context ends returns at once, before the round trip in progress ends")

	// One leading call ends and hands the lead to the oldest queued call,
	// which takes every other queued call along; the other leading calls are
	// let go only after that, so that they find nobody queued.
	g.open <- struct{}{}
	for i, res := range results {
		if i != 3 {
			assert.NoError(t, <-res, "call %d", i)
		}
	}
	close(g.open)
	for _, res := range leaders {
		require.NoError(t, <-res)
	}
	assert.Equal(t, int64(maxLeaders+1), g.roundTrips.Load(), "one round trip for each leading call, one for all that queued")
	entries, err := client.XRange(ctx, topic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, maxLeaders+calls-1, "the leading calls and every queued call but the cancelled one")
	var leaderNames []any
	for i := range maxLeaders {
		leaderNames = append(leaderNames, fmt.Sprintf("leader-%d", i))
	}
	assert.Contains(t, leaderNames, entries[0].Values[FieldUUID], "the leading call let go first is written first")
	for _, e := range entries[1:calls] {
		assert.NotContains(t, leaderNames, e.Values[FieldUUID], "the queued calls are written together")
	}
	for _, e := range entries[calls:] {
		assert.Contains(t, leaderNames, e.Values[FieldUUID], "the leading calls let go last are written last")
	}
	assert.Empty(t, pub.combiners.byKey, "no combiner is kept once its calls are done")
}

// A round trip in progress for one stream holds up no call for another.
func TestPublishToAnotherTopicIsNotHeldUp(t *testing.T) {
	testserver.Parallel(t)
	pub, client, g := gatedPublisher(t)
	slow, other := "combine-slow-"+watermill.NewShortUUID(), "combine-other-"+watermill.NewShortUUID()
	held := holdLeaders(pub, g, slow)
	require.NoError(t, pub.Publish(other, message.NewMessage(watermill.NewUUID(), []byte("x"))))
	assert.Equal(t, int64(1), client.XLen(context.Background(), other).Val())
	close(g.open)
	for _, res := range held {
		require.NoError(t, <-res)
	}
}

// panicHook panics in the first pipeline that carries XADD.
type panicHook struct{ once sync.Once }

func (h *panicHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "xadd" {
			h.once.Do(func() { panic("hook failure") })
		}
		return next(ctx, cmds)
	}
}

// A panic while a shared round trip is sent (in a client hook, say) reaches
// the leading call; the calls it carried fail, and later calls still go.
func TestPanicInASharedRoundTripReleasesEveryCall(t *testing.T) {
	testserver.Parallel(t)
	pub, client, g := gatedPublisher(t)
	client.AddHook(&panicHook{})
	topic := "combine-" + watermill.NewShortUUID()
	leaders := holdLeaders(pub, g, topic)
	const calls = 3
	panicked := make(chan any, calls)
	results := make([]chan error, calls)
	for i := range calls {
		results[i] = make(chan error, 1)
		go func() {
			defer func() {
				if r := recover(); r != nil {
					panicked <- r
					results[i] <- nil
				}
			}()
			results[i] <- pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x")))
		}()
	}
	queued(t, pub, topic, calls)
	// One leading call ends and hands the lead to the oldest queued call,
	// which takes the others along; the second leading call goes after.
	g.open <- struct{}{}
	aborted := 0
	for _, res := range results {
		if err := <-res; err != nil {
			assert.ErrorIs(t, err, errSendAborted)
			aborted++
		}
	}
	close(g.open)
	for _, res := range leaders {
		require.NoError(t, <-res)
	}
	require.Len(t, panicked, 1, "the leader of the shared round trip sees the panic")
	assert.Equal(t, calls-1, aborted, "the calls it carried fail")
	assert.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("x")), message.NewMessage(watermill.NewUUID(), []byte("x"))), "the next calls go on")
	assert.Empty(t, pub.combiners.byKey)
}

// Many goroutines publishing at once lose nothing and leave no call waiting.
func TestManyConcurrentPublishers(t *testing.T) {
	testserver.Parallel(t)
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
	assert.Empty(t, pub.combiners.byKey)
}
