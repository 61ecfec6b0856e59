package partition

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/testserver"
)

// partEnv is a private server and partition 0 of two of topic "t" in
// group "g", whose group exists.
type partEnv struct {
	client *redis.Client
	p      *Partition
	keys   Keys
}

func newPartEnv(t *testing.T) *partEnv {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: testserver.Start(t).Addr()})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewLayout("t", 2)
	require.NoError(t, err)
	keys := l.Keys(0, "g")
	require.NoError(t, client.XGroupCreateMkStream(context.Background(), keys.Stream, "g", "0").Err())
	return &partEnv{client: client, p: NewPartition(client, keys, "g"), keys: keys}
}

// add appends n entries and returns their ids.
func (e *partEnv) add(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := e.client.XAdd(context.Background(), &redis.XAddArgs{Stream: e.keys.Stream, Values: []any{"n", i}}).Result()
		require.NoError(t, err)
		ids[i] = id
	}
	return ids
}

// pending returns the consumer and delivery count of each pending entry,
// by id.
func (e *partEnv) pending(t *testing.T) map[string]redis.XPendingExt {
	t.Helper()
	list, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: e.keys.Stream, Group: "g", Start: "-", End: "+", Count: 1000}).Result()
	require.NoError(t, err)
	m := map[string]redis.XPendingExt{}
	for _, p := range list {
		m[p.ID] = p
	}
	return m
}

// lapse makes the owner record lapse now and waits until it is gone.
func (e *partEnv) lapse(t *testing.T) {
	t.Helper()
	// The record's TTL is cut to a millisecond here rather than given
	// short at Acquire: a short TTL could lapse on a loaded machine before
	// the test's first call, which must still find it.
	require.NoError(t, e.client.PExpire(context.Background(), e.keys.Owner, time.Millisecond).Err())
	require.Eventually(t, func() bool { return e.client.Exists(context.Background(), e.keys.Owner).Val() == 0 },
		10*time.Second, 5*time.Millisecond, "the owner record did not lapse")
}

func ids(es []loop.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

func TestAcquireRenewReleaseAndTheEpochGrows(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)

	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, Token{Member: "a", Epoch: 1}, a.Token())
	assert.Equal(t, "a:1", e.client.Get(ctx, e.keys.Owner).Val())
	ttl := e.client.PTTL(ctx, e.keys.Owner).Val()
	assert.True(t, ttl > 50*time.Second && ttl <= time.Minute, "the record's TTL: got %s", ttl)

	_, err = e.p.Acquire(ctx, "b", time.Minute)
	var held *HeldError
	require.True(t, errors.As(err, &held), "got %v, want a *HeldError", err)
	assert.ErrorIs(t, err, ErrHeld)
	assert.Equal(t, Token{Member: "a", Epoch: 1}, held.Holder)
	assert.Positive(t, held.TTL)
	assert.Equal(t, "1", e.client.Get(ctx, e.keys.Epoch).Val(), "a refused acquisition leaves the epoch alone")

	holder, _, ok, err := e.p.Holder(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, a.Token(), holder)

	require.NoError(t, e.client.PExpire(ctx, e.keys.Owner, time.Second).Err())
	retaken, err := a.Renew(ctx)
	require.NoError(t, err)
	assert.False(t, retaken)
	assert.Greater(t, e.client.PTTL(ctx, e.keys.Owner).Val(), 50*time.Second, "the renewal restored the TTL")

	require.NoError(t, a.Release(ctx))
	assert.Zero(t, e.client.Exists(ctx, e.keys.Owner).Val(), "the release deleted the record")
	_, _, ok, err = e.p.Holder(ctx)
	require.NoError(t, err)
	assert.False(t, ok)

	b, err := e.p.Acquire(ctx, "b", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, Token{Member: "b", Epoch: 2}, b.Token(), "every acquisition grows the epoch")
	_, err = a.Renew(ctx)
	assert.ErrorIs(t, err, ErrFenced, "a's renewal after b acquired")
	assert.ErrorIs(t, a.Release(ctx), ErrFenced, "a's release after b acquired")
	assert.Equal(t, "b:2", e.client.Get(ctx, e.keys.Owner).Val(), "a's calls left b's record alone")
	require.NoError(t, b.Release(ctx))

	// The same member again is a new ownership: a new epoch, and the old
	// one's token is fenced.
	a2, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, Token{Member: "a", Epoch: 3}, a2.Token())
	_, err = a.Renew(ctx)
	assert.ErrorIs(t, err, ErrFenced, "the first ownership of a is not the third")
}

// A record that lapsed while nobody acquired the partition is written
// again by the renewal; once another member acquired it, the renewal is
// fenced.
func TestRenewRetakesALapsedRecordOnlyIfNobodyAcquired(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	// A record deleted is one that lapsed; the TTL stays long enough
	// that the retaken record outlives the checks on a loaded machine.
	a, err := e.p.Acquire(ctx, "member:with:colons", 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, e.client.Del(ctx, e.keys.Owner).Err())
	retaken, err := a.Renew(ctx)
	require.NoError(t, err)
	assert.True(t, retaken)
	assert.Equal(t, "member:with:colons:1", e.client.Get(ctx, e.keys.Owner).Val())
	holder, _, _, err := e.p.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, Token{Member: "member:with:colons", Epoch: 1}, holder)

	require.NoError(t, e.client.Del(ctx, e.keys.Owner).Err())
	b, err := e.p.Acquire(ctx, "b", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, int64(2), b.Token().Epoch)
	_, err = a.Renew(ctx)
	assert.ErrorIs(t, err, ErrFenced)
	assert.Equal(t, "b:2", e.client.Get(ctx, e.keys.Owner).Val())
}

// An owner whose record lapsed, and whose partition another member
// acquired, can neither read, acknowledge, hand over nor hold: each call is
// fenced and changes nothing, and its Ack does not remove what the new
// owner holds.
func TestALostOwnerIsFenced(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	sent := e.add(t, 3)

	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	got, err := a.Read(ctx, ">", 2)
	require.NoError(t, err)
	require.Equal(t, sent[:2], ids(got))
	e.lapse(t)

	// Lapsed, not acquired yet: fenced as well.
	_, err = a.Read(ctx, ">", 1)
	assert.ErrorIs(t, err, ErrFenced)

	b, err := e.p.Acquire(ctx, "b", time.Minute)
	require.NoError(t, err)
	h, err := b.HandOver(ctx, "0-0", 100)
	require.NoError(t, err)
	assert.Equal(t, HandedOver{Next: "0-0", Moved: 2}, h)

	_, err = a.Read(ctx, ">", 10)
	assert.ErrorIs(t, err, ErrFenced, "read of new entries")
	_, err = a.Read(ctx, "0", 10)
	assert.ErrorIs(t, err, ErrFenced, "read of own pending entries")
	_, err = a.Ack(ctx, sent[:1])
	assert.ErrorIs(t, err, ErrFenced, "ack")
	_, err = a.HandOver(ctx, "0-0", 100)
	assert.ErrorIs(t, err, ErrFenced, "hand-over")
	_, err = a.Hold(ctx, sent[:1])
	assert.ErrorIs(t, err, ErrFenced, "hold")
	_, err = a.ClaimBack(ctx, sent[0], 1)
	assert.ErrorIs(t, err, ErrFenced, "nack claim")
	assert.ErrorIs(t, a.HandBack(ctx, sent[:1], time.Hour), ErrFenced, "hand-back")
	assert.Contains(t, err.Error(), "a:1")

	p := e.pending(t)
	require.Len(t, p, 2, "a's calls changed no pending entry")
	for _, id := range sent[:2] {
		assert.Equal(t, "b", p[id].Consumer, "entry %s is b's", id)
		assert.Equal(t, int64(1), p[id].RetryCount, "entry %s: only a's read delivered it", id)
	}
	// a's fenced read of new entries took nothing: the third entry is b's
	// to read.
	got, err = b.Read(ctx, ">", 10)
	require.NoError(t, err)
	assert.Equal(t, sent[2:], ids(got))
	n, err := b.Ack(ctx, sent)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
}

// The new owner takes what the old one left pending, in pages, then reads
// it in stream order, each delivery count grown by that read, and then the
// new entries.
func TestHandOverMovesTheOldOwnersPendingEntries(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	sent := e.add(t, 7)

	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	got, err := a.Read(ctx, ">", 6)
	require.NoError(t, err)
	require.Equal(t, sent[:6], ids(got))
	n, err := a.Ack(ctx, []string{sent[1], sent[4]})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	// One entry was delivered twice to a already.
	_, err = a.Read(ctx, "0", 1)
	require.NoError(t, err)
	require.NoError(t, a.Release(ctx))
	left := []string{sent[0], sent[2], sent[3], sent[5]}

	b, err := e.p.Acquire(ctx, "b", time.Minute)
	require.NoError(t, err)
	moved := int64(0)
	from := "0-0"
	for calls := 1; ; calls++ {
		h, err := b.HandOver(ctx, from, 3)
		require.NoError(t, err)
		moved += h.Moved
		from = h.Next
		if from == "0-0" {
			assert.Equal(t, 2, calls, "4 entries, 3 a call")
			break
		}
		require.Less(t, calls, 10, "the hand-over does not end")
	}
	assert.Equal(t, int64(4), moved)
	for _, id := range left {
		assert.Equal(t, "b", e.pending(t)[id].Consumer)
	}

	got, err = b.Read(ctx, "0", 10)
	require.NoError(t, err)
	assert.Equal(t, left, ids(got), "b reads what a left, in stream order")
	assert.Equal(t, map[string]any{"n": "0"}, got[0].Fields)
	counts, err := b.Hold(ctx, left)
	require.NoError(t, err)
	assert.Equal(t, []int64{3, 2, 2, 2}, counts, "each count grown by b's read (the first was read twice by a)")

	got, err = b.Read(ctx, ">", 10)
	require.NoError(t, err)
	assert.Equal(t, sent[6:], ids(got), "then the new entries")

	// a's name holds nothing now: the prune removes it, and keeps b.
	removed, err := b.Prune(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), removed)
	consumers, err := e.client.XInfoConsumers(ctx, e.keys.Stream, "g").Result()
	require.NoError(t, err)
	require.Len(t, consumers, 1)
	assert.Equal(t, "b", consumers[0].Name)
	_, err = a.Prune(ctx)
	assert.ErrorIs(t, err, ErrFenced, "a former owner prunes")
}

// The nack claim and the hold of an owner behave as the loop's own.
func TestOwnerHoldClaimBackAndHandBack(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	sent := e.add(t, 3)
	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	_, err = a.Read(ctx, ">", 2)
	require.NoError(t, err)
	require.NoError(t, e.client.XDel(ctx, e.keys.Stream, sent[1]).Err())

	counts, err := a.Hold(ctx, sent)
	require.NoError(t, err)
	assert.Equal(t, []int64{1, -1, 0}, counts, "held, body gone, not pending")

	c, err := a.ClaimBack(ctx, sent[0], 1)
	require.NoError(t, err)
	assert.Equal(t, loop.ClaimedBack{Status: "ok", Count: 2, Fields: map[string]any{"n": "0"}}, c)
	c, err = a.ClaimBack(ctx, sent[0], 1)
	require.NoError(t, err)
	assert.Equal(t, int64(2), c.Count, "sent again, the claim answers as the first did")
	c, err = a.ClaimBack(ctx, sent[2], 1)
	require.NoError(t, err)
	assert.Equal(t, "gone", c.Status)

	require.NoError(t, a.HandBack(ctx, sent[:1], time.Hour))
	p := e.pending(t)[sent[0]]
	assert.GreaterOrEqual(t, p.Idle, time.Hour)
	assert.Equal(t, int64(2), p.RetryCount, "the hand-back leaves the count alone")
}

// A fenced call on a group that does not exist returns the server's
// NOGROUP reply as it came.
func TestOwnerCallsReturnNoGroup(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	require.NoError(t, e.client.XGroupDestroy(ctx, e.keys.Stream, "g").Err())
	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	_, err = a.Read(ctx, ">", 1)
	assert.True(t, redis.HasErrorPrefix(err, "NOGROUP"), "read: got %v", err)
	_, err = a.HandOver(ctx, "0-0", 10)
	assert.True(t, redis.HasErrorPrefix(err, "NOGROUP"), "hand-over: got %v", err)
	_, err = a.Ack(ctx, []string{"1-1"})
	assert.NoError(t, err, "XACK of a missing group counts 0")
}
