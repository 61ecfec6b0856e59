package coalesce

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// pipelineCounter counts the pipelines a client sends that carry a
// command of the tests (the connection's handshake aside).
type pipelineCounter struct{ n atomic.Int64 }

func (*pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && (cmds[0].Name() == "incrby" || cmds[0].Name() == "incr") {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// frozenEnv is a private server, frozen (it answers nothing) until thaw.
type frozenEnv struct {
	srv    *testserver.Server
	client *redis.Client
	trips  *pipelineCounter
}

func newEnv(t *testing.T) *frozenEnv {
	srv := testserver.Start(t)
	if !srv.Restartable() {
		t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be frozen by the test")
	}
	// A frozen server holds the round trips: the client waits for it.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 4, ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	trips := &pipelineCounter{}
	client.AddHook(trips)
	return &frozenEnv{srv: srv, client: client, trips: trips}
}

// onItsWay waits until a round trip is on its way and no call waits.
func onItsWay(t *testing.T, p *Pipes) {
	t.Helper()
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.leaders == 1 && len(p.queue) == 0
	}, 10*time.Second, time.Millisecond, "a round trip on its way")
}

// queued waits until n calls wait for a round trip.
func queued(t *testing.T, p *Pipes, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.queue) == n
	}, 10*time.Second, time.Millisecond, "%d calls waiting", n)
}

// While one round trip is on its way, every call that comes waits, and all
// of them go in the next one: 1 + 199 calls in 2 round trips, each with its
// own reply.
func TestCallsThatWaitShareOneRoundTrip(t *testing.T) {
	e := newEnv(t)
	p := New(e.client, 1)
	require.NoError(t, e.srv.Freeze())
	thawed := false
	defer func() {
		if !thawed {
			_ = e.srv.Thaw()
		}
	}()
	ctx := context.Background()
	const calls = 200
	cmds := make([]*redis.IntCmd, calls)
	var wg sync.WaitGroup
	start := func(i int) {
		cmds[i] = redis.NewIntCmd(ctx, "incrby", fmt.Sprintf("k%d", i), i+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Exec(ctx, []redis.Cmder{cmds[i]})
		}()
	}
	start(0)
	onItsWay(t, p) // the first, held by the frozen server
	for i := 1; i < calls; i++ {
		start(i)
	}
	queued(t, p, calls-1)
	require.NoError(t, e.srv.Thaw())
	thawed = true
	wg.Wait()
	for i, cmd := range cmds {
		require.NoError(t, cmd.Err(), "call %d", i)
		assert.Equal(t, int64(i+1), cmd.Val(), "call %d", i)
	}
	assert.Equal(t, int64(2), e.trips.n.Load(), "round trips")
}

// A call whose context ends while it waits for a round trip returns at
// once, with its context's error, and is never sent.
func TestACallWhoseContextEndsBeforeItIsSentIsNotSent(t *testing.T) {
	e := newEnv(t)
	p := New(e.client, 1)
	require.NoError(t, e.srv.Freeze())
	ctx := context.Background()
	first := redis.NewIntCmd(ctx, "incr", "first")
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		p.Exec(ctx, []redis.Cmder{first})
	}()
	onItsWay(t, p)
	short, cancel := context.WithCancel(ctx)
	late := redis.NewIntCmd(short, "incr", "late")
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		p.Exec(short, []redis.Cmder{late})
	}()
	queued(t, p, 1)
	cancel()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("a call whose context ended did not return while the server was frozen")
	}
	assert.ErrorIs(t, late.Err(), context.Canceled)
	require.NoError(t, e.srv.Thaw())
	<-firstDone
	require.NoError(t, first.Err())
	n, err := e.client.Exists(ctx, "late").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the cancelled call was sent")
}

// A call already on its way when its context ends waits for its round
// trip (which ends at the latest deadline it carries), so that its
// commands are not read while the round trip writes them.
func TestACallOnItsWayWaitsForItsRoundTrip(t *testing.T) {
	e := newEnv(t)
	p := New(e.client, 1)
	require.NoError(t, e.srv.Freeze())
	ctx, cancel := context.WithCancel(context.Background())
	cmd := redis.NewIntCmd(ctx, "incr", "k")
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		p.Exec(ctx, []redis.Cmder{cmd})
	}()
	onItsWay(t, p)
	cancel()
	select {
	case <-returned:
		t.Fatal("returned while its round trip was on its way")
	case <-time.After(100 * time.Millisecond): // the time it must keep waiting: the scenario
	}
	require.NoError(t, e.srv.Thaw())
	<-returned
	require.NoError(t, cmd.Err())
	assert.Equal(t, int64(1), cmd.Val())
}
