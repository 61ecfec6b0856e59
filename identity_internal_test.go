package valkeystream

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestLeaseWatchProvesAHolderAliveOnlyByARenewalOrANewHolder(t *testing.T) {
	type poll struct {
		holder string
		pttl   int64
		want   holderVerdict
	}
	tests := []struct {
		name  string
		polls []poll
	}{
		{name: "a shrinking lease proves nothing", polls: []poll{
			{"a", 9000, holderUnproven}, {"a", 8500, holderUnproven}, {"a", 8500, holderUnproven}, {"a", 10, holderUnproven}}},
		{name: "a renewal proves the holder alive", polls: []poll{
			{"a", 9000, holderUnproven}, {"a", 8000, holderUnproven}, {"a", 9990, holderAlive}}},
		{name: "a new holder is alive", polls: []poll{
			{"a", 100, holderUnproven}, {"b", 50, holderAlive}}},
		{name: "a lease without expiry never lapses", polls: []poll{
			{"a", -1, holderForever}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w leaseWatch
			for i, p := range tt.polls {
				if got := w.observe(p.holder, p.pttl); got != p.want {
					t.Fatalf("poll %d (%s, %d ms): got verdict %d, want %d", i, p.holder, p.pttl, got, p.want)
				}
			}
		})
	}
}

func TestLeaseKeyBeginsWithTheStreamKeyAndKeepsGroupsApart(t *testing.T) {
	assert.Equal(t, "{orders}.eu:lease:billing:host-1", leaseKey("{orders}.eu", "billing", "host-1"))
	assert.NotEqual(t, leaseKey("s", "a:b", "c"), leaseKey("s", "a", "b:c"), "a ':' in a group must not make two leases one")
	assert.Equal(t, "s:lease:a%3Ab%25:c", leaseKey("s", "a:b%", "c"))
	assert.Equal(t, "host", indexedName("host", 1))
	assert.Equal(t, "host-3", indexedName("host", 3))
}

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
	require.NoError(t, client.Set(ctx, leaseKey(stream, group, "leased"), "someone", time.Minute).Err())

	const age = 300 * time.Millisecond
	time.Sleep(age + 100*time.Millisecond)
	// recent handles an entry: active now, nothing pending.
	id := client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"f", "v"}}).Val()
	require.NoError(t, client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "recent", Streams: []string{stream, ">"}, Count: 1, Block: -1}).Err())
	require.NoError(t, client.XAck(ctx, stream, group, id).Err())

	sub, err := NewSubscriber(SubscriberConfig{Client: client, ConsumerGroup: group, Consumer: "self", Start: StartHead}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	w := sub.newPruner(stream, "self", sub.logger)
	w.age = age
	removed, err := w.removeDeparted(ctx)
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
}
