package combine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
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

// newClient returns a client of a private server.
func newClient(t *testing.T) *redis.Client {
	t.Helper()
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 8})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// gatedCombiner returns a Combiner whose first maxLeaders round trips
// carrying XADD are held by the returned gate, and which counts in
// roundTrips the round trips it sends.
func gatedCombiner(t *testing.T) (*Combiner, *redis.Client, *gate, *atomic.Int64) {
	t.Helper()
	client := newClient(t)
	g := &gate{open: make(chan struct{}), held: make(chan struct{})}
	client.AddHook(g)
	var roundTrips atomic.Int64
	return New(client, ReplicaWait{}, func(int) { roundTrips.Add(1) }), client, g, &roundTrips
}

// request returns a request for key carrying one entry per name, each with
// the field "name".
func request(key string, names ...string) *Request {
	r := NewRequest(len(names))
	for i, name := range names {
		r.Args[i] = redis.XAddArgs{Stream: key, Values: []any{"name", name}}
	}
	return r
}

// queued waits until n calls queue for key behind the round trips in
// progress.
func queued(t *testing.T, c *Combiner, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		s := c.byKey[key]
		c.mu.Unlock()
		if s == nil {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.waiting) == n
	}, 10*time.Second, time.Millisecond, "%d calls queue behind the round trips in progress", n)
}

// keys returns how many stream combiners c keeps.
func keys(c *Combiner) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}

// holdLeaders starts maxLeaders calls for key and returns once the gate
// holds their round trips; receive their outcomes from the channels.
func holdLeaders(c *Combiner, g *gate, key string) []chan error {
	var results []chan error
	for i := range maxLeaders {
		results = append(results, writeAsync(context.Background(), c, key, fmt.Sprint("leader-", i)))
	}
	<-g.held
	return results
}

// writeAsync writes one entry named name to key and sends its outcome on
// the returned channel.
func writeAsync(ctx context.Context, c *Combiner, key, name string) chan error {
	res := make(chan error, 1)
	go func() {
		r := request(key, name)
		c.Write(ctx, key, r)
		res <- r.Errs[0]
	}()
	return res
}

// Calls that arrive while maxLeaders round trips are in progress go
// together in the next one, each with its own outcome: a call whose context
// ended while it was queued writes nothing.
func TestCombinerSharesRoundTrips(t *testing.T) {
	testserver.Parallel(t)
	c, client, g, counted := gatedCombiner(t)
	ctx := context.Background()
	key := "combine-" + watermill.NewShortUUID()
	leaders := holdLeaders(c, g, key)

	const calls = 10
	cancelled, cancel := context.WithCancel(ctx)
	results := make([]chan error, calls)
	for i := range calls {
		callCtx := ctx
		if i == 3 {
			callCtx = cancelled
		}
		results[i] = writeAsync(callCtx, c, key, fmt.Sprint("queued-", i))
	}
	queued(t, c, key, calls)
	cancel()
	assert.ErrorIs(t, <-results[3], context.Canceled, "a queued call whose context ends returns at once, before the round trips in progress end")

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
	assert.Equal(t, g.roundTrips.Load(), counted.Load(), "every round trip sent is counted")
	entries, err := client.XRange(ctx, key, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, maxLeaders+calls-1, "the leading calls and every queued call but the cancelled one")
	var leaderNames []any
	for i := range maxLeaders {
		leaderNames = append(leaderNames, fmt.Sprintf("leader-%d", i))
	}
	assert.Contains(t, leaderNames, entries[0].Values["name"], "the leading call let go first is written first")
	for _, e := range entries[1:calls] {
		assert.NotContains(t, leaderNames, e.Values["name"], "the queued calls are written together")
	}
	for _, e := range entries[calls:] {
		assert.Contains(t, leaderNames, e.Values["name"], "the leading calls let go last are written last")
	}
	assert.Zero(t, keys(c), "no stream combiner is kept once its calls are done")
}

// Round trips in progress for one stream hold up no call for another.
func TestCombinerHoldsUpNoOtherStream(t *testing.T) {
	testserver.Parallel(t)
	c, client, g, _ := gatedCombiner(t)
	slow, other := "combine-slow-"+watermill.NewShortUUID(), "combine-other-"+watermill.NewShortUUID()
	held := holdLeaders(c, g, slow)
	r := request(other, "x")
	c.Write(context.Background(), other, r)
	require.NoError(t, r.Errs[0])
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
// the leading call; the calls it carried fail with ErrSendAborted, and later
// calls still go.
func TestCombinerReleasesEveryCallAfterAPanic(t *testing.T) {
	testserver.Parallel(t)
	c, client, g, _ := gatedCombiner(t)
	client.AddHook(&panicHook{})
	key := "combine-" + watermill.NewShortUUID()
	leaders := holdLeaders(c, g, key)
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
			r := request(key, fmt.Sprint("queued-", i))
			c.Write(context.Background(), key, r)
			results[i] <- r.Errs[0]
		}()
	}
	queued(t, c, key, calls)
	// One leading call ends and hands the lead to the oldest queued call,
	// which takes the others along; the other leading calls go after.
	g.open <- struct{}{}
	aborted := 0
	for _, res := range results {
		if err := <-res; err != nil {
			assert.ErrorIs(t, err, ErrSendAborted)
			aborted++
		}
	}
	close(g.open)
	for _, res := range leaders {
		require.NoError(t, <-res)
	}
	require.Len(t, panicked, 1, "the leader of the shared round trip sees the panic")
	assert.Equal(t, calls-1, aborted, "the calls it carried fail")
	next := request(key, "after-1", "after-2")
	c.Write(context.Background(), key, next)
	assert.Equal(t, []error{nil, nil}, next.Errs, "the next calls go on")
	assert.Zero(t, keys(c))
}

// Many goroutines writing at once lose nothing, count every message once,
// and leave no call waiting.
func TestCombinerWithManyWriters(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	var roundTrips, messages atomic.Int64
	c := New(client, ReplicaWait{}, func(n int) {
		roundTrips.Add(1)
		messages.Add(int64(n))
	})
	key := "combine-" + watermill.NewShortUUID()
	const goroutines, calls = 64, 30
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range calls {
				names := make([]string, 1+i%3)
				for j := range names {
					names[j] = fmt.Sprint(i, "-", j)
				}
				r := request(key, names...)
				c.Write(context.Background(), key, r)
				for _, err := range r.Errs {
					assert.NoError(t, err)
				}
			}
		})
	}
	wg.Wait()
	want := int64(goroutines * (calls / 3) * (1 + 2 + 3))
	assert.Equal(t, want, client.XLen(context.Background(), key).Val())
	assert.Equal(t, want, messages.Load(), "messages counted in round trips")
	assert.LessOrEqual(t, roundTrips.Load(), int64(goroutines*calls), "no more round trips than calls")
	assert.Zero(t, keys(c))
}

// On a server without replicas, a WAIT for one fails every message of the
// round trip with a *NotReplicatedError, and the entries are written; a
// one-message call waits too.
func TestCombinerWaitWithoutReplicas(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	wait := ReplicaWait{Replicas: 1, Timeout: 50 * time.Millisecond}
	c := New(client, wait, nil)
	key := "combine-" + watermill.NewShortUUID()
	for _, names := range [][]string{{"one"}, {"two-1", "two-2"}} {
		r := request(key, names...)
		c.Write(context.Background(), key, r)
		for i, err := range r.Errs {
			short, ok := errors.AsType[*NotReplicatedError](err)
			require.True(t, ok, "message %d of %d: got %v, want a *NotReplicatedError", i, len(names), err)
			assert.Equal(t, wait, short.Wait)
			assert.Zero(t, short.Acked)
			assert.NoError(t, short.Err)
		}
	}
	assert.Equal(t, int64(3), client.XLen(context.Background(), key).Val(), "entries written although not replicated")
}

func TestCombinerCheckWaitReply(t *testing.T) {
	wait := ReplicaWait{Replicas: 2, Timeout: 1500 * time.Millisecond}
	reply := func(n int64, err error) *redis.IntCmd {
		cmd := redis.NewIntCmd(context.Background(), "wait", 2, 1500)
		cmd.SetVal(n)
		cmd.SetErr(err)
		return cmd
	}
	lost := errors.New("connection reset")
	for _, tc := range []struct {
		name  string
		reply *redis.IntCmd
		want  string // "" for no error
	}{
		{"no WAIT", nil, ""},
		{"enough replicas", reply(2, nil), ""},
		{"more than enough", reply(3, nil), ""},
		{"too few", reply(1, nil), "1 of 2 replicas acknowledged within 1.5s"},
		{"reply lost", reply(0, lost), "WAIT 2 1500 failed: connection reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := wait.check(tc.reply)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, tc.want, err.Error())
			if tc.reply.Err() != nil {
				assert.ErrorIs(t, err, lost)
			}
		})
	}
}

// Only idempotent writes may be sent again by the client: a plain XADD
// sent twice stores its message twice.
func TestCommandRetriesOnlyIdempotentWrites(t *testing.T) {
	ctx := context.Background()
	noRetry := func(c redis.Cmder) bool {
		n, ok := c.(interface{ NoRetry() bool })
		return ok && n.NoRetry()
	}
	plain := NewRequest(1)
	plain.Args[0] = redis.XAddArgs{Stream: "s", Values: []any{"f", "v"}}
	idmp := NewRequest(1)
	idmp.Args[0] = redis.XAddArgs{Stream: "s", Values: []any{"f", "v"}, Mode: "ACKED", MaxLen: 5, Approx: true,
		ProducerID: "p", IdempotentID: "u"}
	marked := NewRequest(2)
	marked.Args[0] = redis.XAddArgs{Stream: "s", Values: []any{"f", "v"}}
	marked.Args[1] = redis.XAddArgs{Stream: "s", Values: []any{"f", "v"}}
	marked.Marks, marked.MarkTTL = []string{"{s}:idmp:u", ""}, 1000

	for _, tc := range []struct {
		name  string
		cmd   redis.Cmder
		once  bool
		first []any // the command's leading arguments
	}{
		{"plain", command(ctx, plain, 0, false), true, []any{"xadd", "s", "*"}},
		{"idmp", command(ctx, idmp, 0, false), false, []any{"xadd", "s", "ACKED", "idmp", "p", "u", "maxlen", "~", int64(5), "*"}},
		{"marked", command(ctx, marked, 0, false), false, []any{"evalsha", MarkScript.Hash(), 2, "{s}:idmp:u", "s", int64(1000), "", "", ""}},
		{"marked by eval", command(ctx, marked, 0, true), false, []any{"eval", markSource, 2, "{s}:idmp:u", "s", int64(1000), "", "", ""}},
		{"without a mark", command(ctx, marked, 1, false), true, []any{"xadd", "s", "*"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.once, noRetry(tc.cmd), "NoRetry")
			args := tc.cmd.Args()
			require.GreaterOrEqual(t, len(args), len(tc.first))
			assert.Equal(t, tc.first, args[:len(tc.first)])
		})
	}
}
