package valkeystream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// readWatch records, for every read of new entries (XREADGROUP ... >) sent
// through a client, what the subscription held when the read was sent.
type readWatch struct {
	sub *valkeystream.Subscriber

	mu    sync.Mutex
	reads int
	held  int // reads sent while the subscription held entries
}

func (w *readWatch) see(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		args := cmd.Args()
		if cmd.Name() != "xreadgroup" || len(args) == 0 || args[len(args)-1] != ">" {
			continue
		}
		st := w.sub.Stats()
		w.mu.Lock()
		w.reads++
		if st.ReadAhead > 0 || st.InFlight > 0 {
			w.held++
		}
		w.mu.Unlock()
	}
}

func (w *readWatch) counts() (reads, held int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reads, w.held
}

func (w *readWatch) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *readWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.see(cmd)
		return next(ctx, cmd)
	}
}
func (w *readWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.see(cmds...)
		return next(ctx, cmds)
	}
}

// watchReads returns a Subscriber on its own client whose reads of new
// entries are recorded.
func (e *env) watchReads(edit ...func(*valkeystream.SubscriberConfig)) (*valkeystream.Subscriber, *readWatch) {
	e.t.Helper()
	client := newClient(e.t, e.srv)
	w := &readWatch{}
	client.AddHook(w)
	w.sub = e.subscriber("g", "c", append([]func(*valkeystream.SubscriberConfig){onClient(client)}, edit...)...)
	return w.sub, w
}

// A fast handler over a backlog gets its next batch read while it still
// settles the last one, so that at a distance from the server it does not
// wait a round trip per batch.
func TestFastHandlerReadsWhileItStillHoldsEntries(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 3000
	e.publish(n)
	sub, w := e.watchReads()
	msgs := e.subscribe(sub)
	for range n {
		receive(t, msgs).Ack()
	}
	require.NoError(t, sub.Close())
	reads, held := w.counts()
	assert.Positive(t, held, "no read of new entries was sent while the handler still had entries (%d reads)", reads)
	assert.Empty(t, e.pending("g"), "everything handled was acknowledged")
}

// A slow handler reads one entry at a time, and only once it holds
// nothing: reads overlap only for handlers that are given several entries
// per read, so a backlog still spreads over the consumers.
func TestSlowHandlerReadsOnlyWhenItHoldsNothing(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 12
	e.publish(n)
	sub, w := e.watchReads()
	msgs := e.subscribe(sub)
	for range n {
		m := receive(t, msgs)
		time.Sleep(15 * time.Millisecond) // longer than PrefetchWindow
		m.Ack()
	}
	require.NoError(t, sub.Close())
	reads, held := w.counts()
	assert.Positive(t, reads, "no read of new entries was seen")
	assert.Zero(t, held, "a read of new entries was sent while a slow handler still held entries")
}

// A handler that takes a while per message has its Ack sent while it
// handles the next, however long AckFlushInterval: a crash then leaves few
// handled entries unacknowledged.
func TestSlowHandlersAckIsSentWhileItHandlesTheNext(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publishAtOnce(3)
	sub := e.subscriber("g", "c", fullBatches, func(c *valkeystream.SubscriberConfig) {
		c.AckFlushInterval = time.Minute
		c.ClaimMinIdle = 3 * time.Minute
	})
	msgs := e.subscribe(sub)
	for _, want := range sent[:2] {
		m := receive(t, msgs)
		require.Equal(t, want.UUID, m.UUID)
		time.Sleep(20 * time.Millisecond) // what the handler takes
		m.Ack()
	}
	// The third message waits in the queue, so no read carries the Acks:
	// they reach the server on their own, long before AckFlushInterval.
	waitUntil(t, "both Acks reached the server", func() bool { return len(e.pending("g")) == 1 })
	third := receive(t, msgs)
	assert.Equal(t, sent[2].UUID, third.UUID)
	third.Ack()
}
