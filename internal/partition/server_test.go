package partition

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/testserver"
)

// waitBlockedXRead waits until a client of client's server is blocked in an
// XREAD.
func waitBlockedXRead(t *testing.T, client *redis.Client) {
	t.Helper()
	assert.Eventually(t, func() bool {
		list, err := client.ClientList(context.Background()).Result()
		if err != nil {
			return false
		}
		for _, line := range strings.Split(list, "\n") {
			fields := strings.Fields(line)
			if slices.Contains(fields, "cmd=xread") && slices.ContainsFunc(fields, func(f string) bool {
				flags, ok := strings.CutPrefix(f, "flags=")
				return ok && strings.Contains(flags, "b")
			}) {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "no XREAD blocked on the server")
}

// A Trip's Acks, reads and hand-backs go in one pipeline of fenced
// scripts, also when the server has lost the scripts (SCRIPT FLUSH).
func TestServerSendsATrip(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	sent := e.add(t, 5)
	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	s := NewServer(a, ServerOptions{})

	r := s.Send(ctx, loop.Trip{Reads: []int64{1, 2}})
	require.NoError(t, r.ReadErr)
	assert.Equal(t, sent[:3], ids(r.Entries))
	assert.True(t, r.Full)

	require.NoError(t, e.client.ScriptFlush(ctx).Err())
	r = s.Send(ctx, loop.Trip{Acks: sent[:2], Reads: []int64{5}, HandBack: sent[2:3], Later: []loop.Later{{ID: sent[3], Idle: time.Minute}}})
	require.NoError(t, r.AckErr)
	require.NoError(t, r.ReadErr)
	require.NoError(t, r.BackErr)
	assert.Equal(t, int64(2), r.Acked)
	assert.Equal(t, sent[3:], ids(r.Entries))
	assert.False(t, r.Full, "5 asked, 2 read")
	p := e.pending(t)
	assert.Len(t, p, 3)
	assert.GreaterOrEqual(t, p[sent[2]].Idle, handedBackIdle)
	assert.GreaterOrEqual(t, p[sent[3]].Idle, time.Minute)
	assert.Less(t, p[sent[4]].Idle, time.Minute)

	own, err := s.ReadOwn(ctx, "0", 10)
	require.NoError(t, err)
	assert.Equal(t, sent[2:], ids(own))
	listed, err := s.ListOwn(ctx, "-", 10)
	require.NoError(t, err)
	assert.Equal(t, sent[2:], listed)
	counts, err := s.Hold(ctx, sent[2:3])
	require.NoError(t, err)
	assert.Equal(t, []int64{2}, counts)
	c, err := s.ClaimBack(ctx, sent[2], 2)
	require.NoError(t, err)
	assert.Equal(t, int64(3), c.Count)
	_, err = s.Claim(ctx, "0-0", 10)
	assert.ErrorContains(t, err, "ClaimInterval")
}

// A lost owner's Trip changes nothing, its errors wrap ErrFenced, and
// Failed tells Lost once.
func TestServerOfALostOwnerIsFenced(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	sent := e.add(t, 2)
	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	var lost atomic.Int64
	s := NewServer(a, ServerOptions{Lost: func(err error) {
		assert.ErrorIs(t, err, ErrFenced)
		lost.Add(1)
	}})
	r := s.Send(ctx, loop.Trip{Reads: []int64{1}})
	require.NoError(t, r.ReadErr)
	e.lapse(t)
	b, err := e.p.Acquire(ctx, "b", time.Minute)
	require.NoError(t, err)
	_, err = b.HandOver(ctx, "0-0", 10)
	require.NoError(t, err)

	r = s.Send(ctx, loop.Trip{Acks: sent[:1], Reads: []int64{5}, HandBack: sent[:1]})
	assert.ErrorIs(t, r.AckErr, ErrFenced)
	assert.ErrorIs(t, r.ReadErr, ErrFenced)
	assert.ErrorIs(t, r.BackErr, ErrFenced)
	assert.Empty(t, r.Entries)
	_, err = s.Block(ctx, 5, time.Second)
	assert.ErrorIs(t, err, ErrFenced)
	_, err = s.ReadOwn(ctx, "0", 5)
	assert.ErrorIs(t, err, ErrFenced)
	_, err = s.Hold(ctx, sent[:1])
	assert.ErrorIs(t, err, ErrFenced)
	_, err = s.ClaimBack(ctx, sent[0], 1)
	assert.ErrorIs(t, err, ErrFenced)

	assert.Equal(t, time.Second, s.Failed(r.AckErr, time.Second))
	s.Failed(r.ReadErr, time.Second)
	s.Failed(errors.New("some other fault"), time.Second)
	assert.Equal(t, int64(1), lost.Load(), "Lost is told once")

	p := e.pending(t)
	require.Len(t, p, 1, "only b's entry is pending: a's fenced read took nothing")
	assert.Equal(t, "b", p[sent[0]].Consumer)
}

// Block waits for a new entry with a plain XREAD, then takes it with the
// fenced read; it returns nothing when none comes within its time, and at
// once after Interrupt.
func TestServerBlockWaitsForNewEntries(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newPartEnv(t)
	old := e.add(t, 1)
	a, err := e.p.Acquire(ctx, "a", time.Minute)
	require.NoError(t, err)
	s := NewServer(a, ServerOptions{})

	es, err := s.Block(ctx, 10, time.Second)
	require.NoError(t, err)
	assert.Equal(t, old, ids(es), "an entry there already comes at once")

	start := time.Now()
	es, err = s.Block(ctx, 10, 200*time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, es)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "Block waited")

	added := make(chan []string)
	go func() {
		waitBlockedXRead(t, e.client) // Block waits: the entry comes while it does
		c := redis.NewClient(&redis.Options{Addr: e.client.Options().Addr})
		defer c.Close()
		id := c.XAdd(ctx, &redis.XAddArgs{Stream: e.keys.Stream, Values: []any{"n", "new"}}).Val()
		added <- []string{id}
	}()
	es, err = s.Block(ctx, 10, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, <-added, ids(es))
	assert.Equal(t, "a", e.pending(t)[es[0].ID].Consumer)

	done := make(chan error, 1)
	go func() {
		_, err := s.Block(ctx, 10, 10*time.Second)
		done <- err
	}()
	waitBlockedXRead(t, e.client) // Block waits: the Interrupt ends a wait
	s.Interrupt()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(2 * time.Second):
		t.Fatal("Interrupt did not end the Block")
	}
	start = time.Now()
	_, err = s.Block(ctx, 10, 10*time.Second)
	assert.Error(t, err, "a Block after Interrupt ends at once")
	assert.Less(t, time.Since(start), 5*time.Second, "a Block after Interrupt waited for its time") // a structural bound: half the 10 s asked for
}
