package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxCombined bounds how many messages one shared round trip carries. A call
// with more messages still goes in one round trip of its own.
const maxCombined = 1000

// maxLeaders bounds the round trips in flight at once for one stream. A
// call released by one round trip waits for the next to leave: with few
// in flight, and their answers coming back together, that wait is most of
// a round trip, which at a distance halves what many publishing goroutines
// get (64 goroutines at a 2.6 ms round trip: 11k/s with two, 15.6k/s with
// eight, go-redis alone with one connection each 13k/s). At loopback the
// batches stay large either way.
const maxLeaders = 8

// errSendAborted is the outcome of calls carried in a round trip whose
// sending panicked (in a client hook, say) in the goroutine of another call.
var errSendAborted = errors.New("valkeystream: publish: the shared round trip was aborted by a panic in another Publish call; the messages may not have been written")

// combiners keeps one combiner per stream key while calls for that key are
// in progress, so that a slow key (or a cluster shard failing over) holds up
// only the calls for that key.
type combiners struct {
	client redis.UniversalClient
	stats  *publisherCounters // counts round trips; nil counts nothing
	wait   replicaWait

	mu    sync.Mutex
	byKey map[string]*combiner
}

// write sends r's messages, all for stream key, in one round trip shared with
// other calls for the same key, and fills r.errs. It returns after the server
// answered for them, or as soon as r.ctx ends while they wait to be sent.
func (cs *combiners) write(key string, r *writeRequest) {
	cs.mu.Lock()
	c := cs.byKey[key]
	if c == nil {
		if cs.byKey == nil {
			cs.byKey = make(map[string]*combiner)
		}
		c = &combiner{client: cs.client, stats: cs.stats, wait: cs.wait, key: key}
		cs.byKey[key] = c
	}
	c.users++
	cs.mu.Unlock()
	defer func() {
		cs.mu.Lock()
		c.users--
		if c.users == 0 {
			delete(cs.byKey, key)
		}
		cs.mu.Unlock()
	}()
	c.write(r)
}

// combiner shares round trips among concurrent calls for one stream key.
// There is no writer goroutine: a call that finds fewer than maxLeaders
// round trips in progress leads one, sending its own messages together with
// those of every call queued so far; when the answer comes it hands the lead
// to the oldest call still queued, or gives it up. A lone caller therefore
// pays no hand-off, and many callers pay one round trip per batch instead of
// one each.
type combiner struct {
	client redis.UniversalClient
	stats  *publisherCounters
	wait   replicaWait
	key    string
	users  int // calls in write; guarded by combiners.mu

	mu      sync.Mutex
	waiting []*writeRequest // queued calls, oldest first
	leaders int             // calls leading a round trip; waiting is empty while below maxLeaders
}

// replicaWait is how many replicas must acknowledge a round trip's entries,
// and for how long to wait for them (WAIT numreplicas timeout). Zero
// replicas: no WAIT.
type replicaWait struct {
	replicas int
	timeout  time.Duration
}

// writeRequest is one Publish call's messages on their way to the server.
type writeRequest struct {
	ctx  context.Context
	args []redis.XAddArgs
	errs []error // per message; nil when the server accepted it

	// one and oneErr hold args and errs of a call with one message, the
	// most common, so that it costs one allocation instead of three.
	one    [1]redis.XAddArgs
	oneErr [1]error

	// done receives false when the messages were sent (errs is final), or
	// true, under combiner.mu, when this call must lead the next round
	// trip. It receives once.
	done chan bool
}

// newWriteRequest returns a request for n messages, its args to be filled.
func newWriteRequest(n int) *writeRequest {
	r := &writeRequest{}
	if n == 1 {
		r.args, r.errs = r.one[:], r.oneErr[:]
	} else {
		r.args, r.errs = make([]redis.XAddArgs, n), make([]error, n)
	}
	return r
}

func (c *combiner) write(r *writeRequest) {
	c.mu.Lock()
	if c.leaders < maxLeaders {
		c.leaders++
		c.mu.Unlock()
		c.lead(r)
		return
	}
	r.done = make(chan bool, 1)
	c.waiting = append(c.waiting, r)
	c.mu.Unlock()
	var lead bool
	select {
	case lead = <-r.done:
	case <-r.ctx.Done():
		lead = c.giveUp(r)
	}
	if lead {
		c.lead(r)
	}
}

// giveUp handles a queued call whose context ended: if it is still queued it
// leaves the queue with the context's error and nothing sent; if it was
// already taken into a round trip it waits for the answer. It reports
// whether the call must lead a round trip after all.
func (c *combiner) giveUp(r *writeRequest) (lead bool) {
	c.mu.Lock()
	select {
	case lead = <-r.done:
		c.mu.Unlock()
		return lead
	default:
	}
	if i := slices.Index(c.waiting, r); i >= 0 {
		c.waiting = slices.Delete(c.waiting, i, i+1)
		c.mu.Unlock()
		fillErr(r.errs, r.ctx.Err())
		return false
	}
	c.mu.Unlock()
	return <-r.done
}

// lead sends self's messages with those of the calls queued so far, then
// passes the lead on to the oldest call still queued (or gives it up) and
// releases the other calls of the batch, even if sending panicked (a client
// hook may panic).
func (c *combiner) lead(self *writeRequest) {
	c.mu.Lock()
	n, messages := 0, len(self.args)
	for n < len(c.waiting) && messages+len(c.waiting[n].args) <= maxCombined {
		messages += len(c.waiting[n].args)
		n++
	}
	batch := make([]*writeRequest, 0, n+1)
	batch = append(append(batch, self), c.waiting[:n]...)
	c.waiting = c.waiting[n:]
	c.mu.Unlock()

	sent := false
	defer func() {
		if !sent {
			for _, r := range batch {
				fillErr(r.errs, errSendAborted)
			}
		}
		c.mu.Lock()
		if len(c.waiting) == 0 {
			c.leaders--
			c.waiting = nil // let the backing array go
		} else {
			next := c.waiting[0]
			c.waiting = c.waiting[1:]
			next.done <- true
		}
		c.mu.Unlock()
		for _, r := range batch[1:] {
			r.done <- false
		}
	}()
	c.send(batch)
	sent = true
}

// send writes the batch in one round trip. A batch of one call is bounded by
// that call's context. A shared one leaves out the calls whose context
// already ended, keeps the values of the leader's context (for tracing
// hooks), and ends at the latest deadline among the calls, if each has one.
func (c *combiner) send(batch []*writeRequest) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		live := batch[:0:0]
		for _, r := range batch {
			if err := r.ctx.Err(); err != nil {
				fillErr(r.errs, err)
				continue
			}
			live = append(live, r)
		}
		if len(live) == 0 {
			return
		}
		batch = live
		var cancel context.CancelFunc
		ctx, cancel = sharedContext(batch)
		defer cancel()
	}
	c.stats.roundTrip(countArgs(batch))
	if c.wait.replicas == 0 && len(batch) == 1 && len(batch[0].args) == 1 {
		batch[0].errs[0] = c.client.XAdd(ctx, &batch[0].args[0]).Err()
		return
	}
	pipe, err := c.pipeline(ctx)
	if err != nil {
		for _, r := range batch {
			fillErr(r.errs, err)
		}
		return
	}
	cmds := make([]*redis.StringCmd, 0, maxCombined)
	for _, r := range batch {
		for i := range r.args {
			cmds = append(cmds, pipe.XAdd(ctx, &r.args[i]))
		}
	}
	var wait *redis.IntCmd
	if c.wait.replicas > 0 {
		wait = redis.NewIntCmd(ctx, "wait", c.wait.replicas, c.wait.timeout.Milliseconds())
		_ = pipe.Process(ctx, wait)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	notReplicated := c.wait.check(wait)
	for _, r := range batch {
		for i := range r.errs {
			r.errs[i] = cmds[0].Err()
			if r.errs[i] == nil {
				r.errs[i] = notReplicated
			}
			cmds = cmds[1:]
		}
	}
}

// pipeline returns the pipeline for a round trip. WAIT counts the writes of
// its own connection, so it must follow the XADDs on the connection that
// carried them; a cluster client would send the keyless WAIT to another
// node (or refuse it in a pipeline), so with WAIT on a cluster the round
// trip goes to the master of the stream's slot directly. A MOVED reply then
// fails the call (nothing was written) and makes the cluster client reload
// its slot map.
func (c *combiner) pipeline(ctx context.Context) (redis.Pipeliner, error) {
	return c.wait.pipeline(ctx, c.client, c.key)
}

// pipeline returns a pipeline on client for writes to key that WAIT may
// follow (see combiner.pipeline).
func (w replicaWait) pipeline(ctx context.Context, client redis.UniversalClient, key string) (redis.Pipeliner, error) {
	cluster, ok := client.(*redis.ClusterClient)
	if !ok || w.replicas == 0 {
		return client.Pipeline(), nil
	}
	master, err := cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	return master.Pipeline(), nil
}

// runScript runs script, whose keys lie in key's slot, and then, with
// replicas to wait for, WAIT in the same round trip on the same connection.
// It returns the script's error, or else the check of the WAIT reply.
func (w replicaWait) runScript(ctx context.Context, client redis.UniversalClient, key string, script *redis.Script, keys []string, args ...any) error {
	if w.replicas == 0 {
		return script.Run(ctx, client, keys, args...).Err()
	}
	pipe, err := w.pipeline(ctx, client, key)
	if err != nil {
		return err
	}
	run := script.Eval(ctx, pipe, keys, args...)
	wait := redis.NewIntCmd(ctx, "wait", w.replicas, w.timeout.Milliseconds())
	_ = pipe.Process(ctx, wait)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if err := run.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return w.check(wait)
}

// check returns nil when the WAIT reply counts enough replicas, else an
// error wrapping ErrNotReplicated.
func (w replicaWait) check(wait *redis.IntCmd) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return fmt.Errorf("%w: WAIT %d %d failed: %w", ErrNotReplicated, w.replicas, w.timeout.Milliseconds(), err)
	case n < int64(w.replicas):
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %s", ErrNotReplicated, n, w.replicas, w.timeout)
	}
	return nil
}

// sharedContext is the context of a round trip shared by batch: the values of
// the first call's context, and the latest of the calls' deadlines when every
// call has one.
func sharedContext(batch []*writeRequest) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, r := range batch {
		d, ok := r.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}

func fillErr(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}
