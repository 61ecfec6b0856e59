package lease

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// The keeper renews the lease, and the release deletes it.
func TestKeepRenewsAndReleaseDeletes(t *testing.T) {
	testserver.Parallel(t)
	e := newLeaseEnv(t, time.Second)
	l, err := e.first(t).Take(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := l.Keep(ctx, cancel, watermill.NopLogger{})

	// Renewed: the lease's time to live grows again. (Above the lowest
	// seen, not the first: read in the millisecond of the take, that one is
	// the whole TTL, which a renewal sets again but never exceeds.)
	lowest := e.client.PTTL(context.Background(), l.key).Val()
	require.Positive(t, lowest)
	require.Eventually(t, func() bool {
		ttl := e.client.PTTL(context.Background(), l.key).Val()
		lowest = min(lowest, ttl)
		return ttl > lowest
	}, 30*time.Second, 10*time.Millisecond, "the keeper did not renew the lease")
	require.NoError(t, ctx.Err(), "the keeper must not end the subscription")
	require.Equal(t, l.token, e.client.Get(context.Background(), l.key).Val())
	release()
	assert.Error(t, ctx.Err(), "the release ends the keeper's context")
	assert.Zero(t, e.client.Exists(context.Background(), l.key).Val(), "the release deleted the lease")
	assert.False(t, isLiveToken(l.token))
	assert.Zero(t, e.faults.Load())
}

// A keeper that finds another subscription's token in the key has lost the
// name: it counts a fault and ends the subscription, and the release leaves
// the new holder's key alone.
func TestKeepEndsTheSubscriptionWhenTheNameIsLost(t *testing.T) {
	testserver.Parallel(t)
	e := newLeaseEnv(t, 500*time.Millisecond)
	l, err := e.first(t).Take(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := l.Keep(ctx, cancel, watermill.NopLogger{})
	require.NoError(t, e.client.Set(context.Background(), l.key, "the-new-holder", time.Minute).Err())

	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the keeper did not end the subscription after it lost the name")
	}
	release()
	assert.Equal(t, int64(1), e.faults.Load())
	assert.Equal(t, "the-new-holder", e.client.Get(context.Background(), l.key).Val())
	assert.False(t, isLiveToken(l.token))
}
