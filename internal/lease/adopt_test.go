package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestIsNameOf(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"worker", true},
		{"worker-2", true},
		{"worker-17", true},
		{"worker-1", false}, // the base name has no index
		{"worker-02", false},
		{"worker-x", false},
		{"worker-2-2", false},
		{"workers", false},
		{"other", false},
	} {
		if got := isNameOf("worker", tt.name); got != tt.want {
			t.Errorf("isNameOf(worker, %q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// holdEntries adds n entries to stream "s" and reads them for consumer of
// group "g" (created if need be), which leaves them pending for it,
// delivered once.
func (e *leaseEnv) holdEntries(t *testing.T, consumer string, n int) {
	t.Helper()
	ctx := context.Background()
	if err := e.client.XGroupCreateMkStream(ctx, "s", "g", "$").Err(); err != nil {
		require.True(t, redis.HasErrorPrefix(err, "BUSYGROUP"), "creating the group: %v", err)
	}
	pipe := e.client.Pipeline()
	for i := range n {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"n", i}})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	got, err := e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "g", Consumer: consumer, Streams: []string{"s", ">"}, Count: int64(n), Block: -1}).Result()
	require.NoError(t, err)
	require.Len(t, got[0].Messages, n)
}

// pendingOf returns the pending entries of the group per consumer, and
// their delivery counts.
func (e *leaseEnv) pendingOf(t *testing.T) (per map[string]int, counts map[int64]int) {
	t.Helper()
	p, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: "s", Group: "g", Start: "-", End: "+", Count: 100000}).Result()
	require.NoError(t, err)
	per, counts = map[string]int{}, map[int64]int{}
	for _, x := range p {
		per[x.Consumer]++
		counts[x.RetryCount]++
	}
	return per, counts
}

// settle waits until a has settled every name (its goroutine returned).
func settle(t *testing.T, a *Adopter) {
	t.Helper()
	require.Eventually(t, func() bool { return !a.Watching() }, 10*time.Second, 5*time.Millisecond,
		"the Adopter must settle every name")
}

// A name whose holder stopped renewing its lease: nothing is moved while
// the lease is on the server; once it lapses, every entry is moved to self
// without a delivery more, Moved receives, and the lease is released.
func TestAdopterTakesOverANameOnceItsLeaseLapses(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newLeaseEnv(t, time.Second)
	e.holdEntries(t, "worker", 3)
	key := Key("s", "g", "worker")
	// The server's expiry events tell a lapse from a replacement.
	require.NoError(t, e.client.ConfigSet(ctx, "notify-keyspace-events", "Ex").Err())
	expiries := e.client.Subscribe(ctx, "__keyevent@0__:expired")
	t.Cleanup(func() { _ = expiries.Close() })
	_, err := expiries.Receive(ctx) // subscribed: the lapse below is seen
	require.NoError(t, err)
	require.NoError(t, e.client.Set(ctx, key, "a-killed-process", 400*time.Millisecond).Err())

	a := NewAdopter(e.cfg, e.deps, "worker-2")
	a.Start(ctx, e.deps.Logger)
	for {
		per, _ := e.pendingOf(t)
		if e.client.Get(ctx, key).Val() != "a-killed-process" {
			break
		}
		require.Equal(t, 3, per["worker"], "entries moved while the holder's lease was still on the server")
		time.Sleep(5 * time.Millisecond) // the poll of a wait for the lease to go
	}
	select {
	case m := <-expiries.Channel():
		require.Equal(t, key, m.Payload, "the key that expired")
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's lease was replaced or deleted: it never expired")
	}
	select {
	case <-a.Moved():
	case <-time.After(10 * time.Second):
		t.Fatal("Moved did not receive within 10 s of the lapse")
	}
	settle(t, a)
	per, counts := e.pendingOf(t)
	assert.Equal(t, map[string]int{"worker-2": 3}, per)
	assert.Equal(t, map[int64]int{1: 3}, counts, "the move grows no delivery count")
	assert.Zero(t, e.client.Exists(ctx, key).Val(), "the Adopter's lease on the name is released")
	assert.Zero(t, e.faults.Load())
	assert.False(t, isLiveToken(a.token))
}

// A holder that renews its lease is alive: its entries stay with it,
// however long its lease lasts, and nothing is reported moved.
func TestAdopterLeavesALiveHolderItsEntries(t *testing.T) {
	testserver.Parallel(t)
	ctx, cancel := context.WithCancel(context.Background())
	e := newLeaseEnv(t, 300*time.Millisecond)
	e.holdEntries(t, "worker", 3)
	key := Key("s", "g", "worker")
	require.NoError(t, e.client.Set(ctx, key, "another-process", 300*time.Millisecond).Err())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the other process's renewals
		defer wg.Done()
		tick := time.NewTicker(60 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				e.client.PExpire(ctx, key, 300*time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	a := NewAdopter(e.cfg, e.deps, "worker-2")
	a.Start(ctx, e.deps.Logger)
	settle(t, a)
	per, _ := e.pendingOf(t)
	assert.Equal(t, map[string]int{"worker": 3}, per, "a live holder keeps its entries")
	assert.Equal(t, "another-process", e.client.Get(ctx, key).Val())
	select {
	case <-a.Moved():
		t.Fatal("Moved received, with nothing moved")
	default:
	}
}

// A name of the base without a lease (its holder left long ago) is taken
// over at once, in batches when it holds many; a name of another base, one
// a subscription of this process holds, and self keep their entries.
func TestAdopterTakesOverDepartedNamesOfItsBaseOnly(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newLeaseEnv(t, time.Minute)
	const many = 2*adoptBatch + 7
	e.holdEntries(t, "worker-3", many)
	e.holdEntries(t, "other", 2)
	e.holdEntries(t, "worker-2", 1)
	// A subscription of this process holds the base name (it renews
	// nothing here: it is known to be alive by its token).
	sibling, err := e.first(t).Take(ctx)
	require.NoError(t, err)
	require.Equal(t, "worker", sibling.Name())
	e.holdEntries(t, "worker", 4)

	a := NewAdopter(e.cfg, e.deps, "worker-2")
	a.Start(ctx, e.deps.Logger)
	settle(t, a)
	per, counts := e.pendingOf(t)
	assert.Equal(t, map[string]int{"worker-2": many + 1, "other": 2, "worker": 4}, per)
	assert.Equal(t, map[int64]int{1: many + 7}, counts, "the move grows no delivery count")
	assert.Zero(t, e.client.Exists(ctx, Key("s", "g", "worker-3")).Val(), "the Adopter's lease is released")
	assert.Equal(t, sibling.token, e.client.Get(ctx, sibling.key).Val())
	<-a.Moved()
	assert.Zero(t, e.faults.Load())
}

// Two subscriptions that both watch a name whose lease lapses: each entry
// is moved once, all of them to one of the two.
func TestAdoptersOfOneNameMoveEachEntryOnce(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newLeaseEnv(t, 200*time.Millisecond)
	e.holdEntries(t, "worker", 50)
	require.NoError(t, e.client.Set(ctx, Key("s", "g", "worker"), "a-killed-process", 200*time.Millisecond).Err())

	b := NewAdopter(e.cfg, e.deps, "worker-2")
	c := NewAdopter(e.cfg, e.deps, "worker-3")
	b.Start(ctx, e.deps.Logger)
	c.Start(ctx, e.deps.Logger)
	settle(t, b)
	settle(t, c)
	per, counts := e.pendingOf(t)
	assert.Len(t, per, 1, "all entries go to one of the two: %v", per)
	assert.Equal(t, 50, per["worker-2"]+per["worker-3"])
	assert.Equal(t, map[int64]int{1: 50}, counts)
}
