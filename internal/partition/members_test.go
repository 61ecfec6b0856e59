package partition

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// Members expire by the server's clock unless they beat again; whoever
// reads removes the expired ones; Leave removes one at once.
func TestMembersExpireUnlessTheyBeat(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testserver.Start(t).Addr()})
	t.Cleanup(func() { _ = client.Close() })
	m := NewMembers(client, "t:members:g")

	got, err := m.Beat(ctx, "zed", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, []string{"zed"}, got)
	got, err = m.Beat(ctx, "short", 200*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, []string{"short", "zed"}, got, "in ascending order")
	_, err = m.Beat(ctx, "alpha", time.Minute)
	require.NoError(t, err)

	// The score is the server's time plus the TTL.
	now, err := client.Time(ctx).Result()
	require.NoError(t, err)
	score := client.ZScore(ctx, "t:members:g", "zed").Val()
	expires := time.UnixMilli(int64(score))
	assert.WithinDuration(t, now.Add(time.Minute), expires, 5*time.Second)
	assert.Positive(t, client.PTTL(ctx, "t:members:g").Val(), "the set lapses after its last member")

	require.Eventually(t, func() bool {
		got, err := m.List(ctx)
		require.NoError(t, err)
		return len(got) == 2
	}, 10*time.Second, 10*time.Millisecond, "the member that stopped beating did not expire")
	got, err = m.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"alpha", "zed"}, got)
	assert.Equal(t, redis.Nil, client.ZScore(ctx, "t:members:g", "short").Err(), "the reader removed the expired member")

	// A beat keeps a member alive past its first TTL: each pushes its
	// expiry on.
	const ttl = time.Second
	_, err = m.Beat(ctx, "beating", ttl)
	require.NoError(t, err)
	for first := time.Now(); time.Since(first) <= ttl; {
		time.Sleep(100 * time.Millisecond) // the time is the scenario: the pause between beats
		before := client.ZScore(ctx, "t:members:g", "beating").Val()
		got, err = m.Beat(ctx, "beating", ttl)
		require.NoError(t, err)
		assert.Contains(t, got, "beating")
		assert.Greater(t, client.ZScore(ctx, "t:members:g", "beating").Val(), before, "a beat did not push the expiry on")
	}

	require.NoError(t, m.Leave(ctx, "zed"))
	got, err = m.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"alpha", "beating"}, got)
	_, err = m.Beat(ctx, "", time.Minute)
	assert.Error(t, err)
}

// A set whose members all expired lapses with its last member.
func TestMembersSetLapsesWithItsLastMember(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testserver.Start(t).Addr()})
	t.Cleanup(func() { _ = client.Close() })
	m := NewMembers(client, "t:members:g")
	_, err := m.Beat(ctx, "a", 100*time.Millisecond)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return client.Exists(ctx, "t:members:g").Val() == 0 },
		10*time.Second, 10*time.Millisecond)
}
