package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestDepartedConsumersAreIdleWithNothingPending(t *testing.T) {
	consumers := []redis.XInfoConsumer{
		{Name: "self", Idle: time.Hour},
		{Name: "gone", Idle: time.Hour},
		{Name: "busy", Idle: time.Hour, Pending: 1},
		{Name: "recent", Idle: time.Second},
	}
	assert.Equal(t, []string{"gone"}, departedConsumers(consumers, time.Minute, "self"))
}

// Pruning removes a consumer that holds nothing, left long ago and whose
// name nobody leases; it keeps one with pending entries, one whose name is
// leased, and one that was active recently. Its script checks again what it
// removes: named a consumer with pending entries, it keeps it.
func TestPruneRemovesOnlyDepartedConsumers(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	const stream, group = "sweep", "g"
	require.NoError(t, client.XGroupCreateMkStream(ctx, stream, group, "0").Err())
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"f", "v"}}).Err())
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "busy", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Err())
	for _, name := range []string{"gone", "leased", "recent", "self"} {
		require.NoError(t, client.XGroupCreateConsumer(ctx, stream, group, name).Err())
	}
	require.NoError(t, client.Set(ctx, Key(stream, group, "leased"), "someone", time.Minute).Err())

	// Long enough that recent, active just before the prune, stays younger
	// than it on a loaded machine.
	const age = 2 * time.Second
	require.Eventually(t, func() bool {
		consumers, err := client.XInfoConsumers(ctx, stream, group).Result()
		require.NoError(t, err)
		for _, c := range consumers {
			if c.Idle <= age {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "the consumers never idle past %s", age)
	// recent handles an entry: active now, nothing pending.
	id := client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"f", "v"}}).Val()
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "recent", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Err())
	require.NoError(t, client.XAck(ctx, stream, group, id).Err())

	var faults atomic.Int64
	p := NewPruner(PruneConfig{Stream: stream, Group: group, Self: "self", Age: age}, client, &faults, watermill.NopLogger{})
	removed, err := p.removeDeparted(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"gone"}, removed)

	removed, err = pruneScript.Run(ctx, client, []string{stream}, group, age.Milliseconds(), "busy").StringSlice()
	require.NoError(t, err)
	assert.Empty(t, removed, "the script must check pending entries itself")

	consumers, err := client.XInfoConsumers(ctx, stream, group).Result()
	require.NoError(t, err)
	var names []string
	for _, c := range consumers {
		names = append(names, c.Name)
	}
	assert.ElementsMatch(t, []string{"busy", "leased", "recent", "self"}, names)
	pending, err := client.XPending(ctx, stream, group).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), pending.Count, "the pending entry of busy is kept")
	assert.Zero(t, faults.Load())
}

// A failed prune (here: no such group) is counted; a negative age removes
// nothing and asks nothing of the server.
func TestPruneCountsAFailureAndANegativeAgeDoesNothing(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })

	var faults atomic.Int64
	NewPruner(PruneConfig{Stream: "none", Group: "g", Self: "self", Age: -1}, client, &faults, watermill.NopLogger{}).Prune(ctx)
	assert.Zero(t, faults.Load())
	NewPruner(PruneConfig{Stream: "none", Group: "g", Self: "self", Age: time.Minute}, client, &faults, watermill.NopLogger{}).Prune(ctx)
	assert.Equal(t, int64(1), faults.Load())
}
