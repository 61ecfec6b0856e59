package valkeystream_test

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

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestRestartedConsumerGetsItsOwnPendingEntriesFirst(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	held := e.publish(3)

	e.readAs("g", "worker", 3) // read, never acknowledged: a crash
	require.Len(t, e.pending("g"), 3)

	newer := e.publish(2)
	restarted := e.subscriber("g", "worker")
	msgs := e.subscribe(restarted)
	for _, want := range held {
		got := receive(t, msgs)
		assert.Equal(t, want.UUID, got.UUID, "own pending entries come first, in order")
		assert.Equal(t, 2, valkeystream.DeliveryCount(got))
		got.Ack()
	}
	for _, want := range newer {
		got := receive(t, msgs)
		assert.Equal(t, want.UUID, got.UUID)
		assert.Equal(t, 1, valkeystream.DeliveryCount(got))
		got.Ack()
	}
	require.NoError(t, restarted.Close())
	assert.Empty(t, e.pending("g"))
	assert.Equal(t, int64(3), restarted.Stats().Drained)
}

func TestPeerReclaimsEntriesOfAConsumerThatNeverReturns(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sent := e.publish(3)
	e.readAs("g", "dead", 3)

	alive := e.subscriber("g", "alive", shortClaim)
	msgs := e.subscribe(alive)
	var got []string
	for range sent {
		m := receive(t, msgs)
		got = append(got, m.UUID)
		assert.Equal(t, 2, valkeystream.DeliveryCount(m), "a reclaim grows the server's count")
		assert.Equal(t, "alive", m.Metadata.Get(valkeystream.MetadataConsumer))
		m.Ack()
	}
	assert.ElementsMatch(t, uuidsOf(sent), got)
	require.NoError(t, alive.Close())
	assert.Empty(t, e.pending("g"))
	assert.Equal(t, int64(3), alive.Stats().Reclaimed)
}

func TestLiveHandlerKeepsItsEntryWhilePeersReclaim(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	holder := e.subscriber("g", "holder", leaseClaim)
	m := receive(t, e.subscribe(holder))
	peerClient, claims := e.commandCounter("xautoclaim")
	peer := e.subscriber("g", "peer", leaseClaim, onClient(peerClient))
	peerGot := collect(t, e.subscribe(peer))

	// Handle for twice ClaimMinIdle while the peer's beat runs, and make
	// sure it ran once the entry could have looked abandoned.
	time.Sleep(1500 * time.Millisecond)
	afterMinIdle := claims.Load()
	time.Sleep(1500 * time.Millisecond) // the time is the scenario: the handling outlasts ClaimMinIdle twice
	waitUntil(t, "a claim beat of the peer after ClaimMinIdle", func() bool { return claims.Load() > afterMinIdle })
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "holder", p[0].Consumer, "a live handler's entry must not be reclaimed")
	assert.Equal(t, int64(1), p[0].RetryCount, "keeping the hold must not grow the delivery count")
	m.Ack()
	require.NoError(t, holder.Close())
	assert.Empty(t, peerGot(), "the peer must not receive the entry being handled")
	assert.Empty(t, e.pending("g"))
}

func TestQueuedEntriesAreNotReclaimedWhileTheBatchIsHandled(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	slow := e.subscriber("g", "slow", fullBatches, leaseClaim)
	msgs := e.subscribe(slow)
	sent := e.publishAtOnce(10)
	first := receive(t, msgs) // the loop has fetched all ten in one batch
	peerClient, claims := e.commandCounter("xautoclaim")
	peerGot := collect(t, e.subscribe(e.subscriber("g", "peer", leaseClaim, onClient(peerClient))))
	start := time.Now()
	var afterMinIdle int64 = -1 // the peer's claims when ClaimMinIdle had passed

	const handling = 350 * time.Millisecond // ten of these outlast ClaimMinIdle twice
	got := []string{first.UUID}
	time.Sleep(handling) // the time is the scenario: the handler's work
	first.Ack()
	for range 9 {
		m := receive(t, msgs)
		assert.Equal(t, 1, valkeystream.DeliveryCount(m), "a queued entry is still on its first delivery")
		got = append(got, m.UUID)
		time.Sleep(handling) // the time is the scenario: the handler's work
		if afterMinIdle < 0 && time.Since(start) > 1500*time.Millisecond {
			afterMinIdle = claims.Load()
		}
		m.Ack()
	}
	require.GreaterOrEqual(t, afterMinIdle, int64(0), "the batch outlasted ClaimMinIdle")
	waitUntil(t, "a claim beat of the peer after ClaimMinIdle", func() bool { return claims.Load() > afterMinIdle })
	require.NoError(t, slow.Close())
	assert.Equal(t, uuidsOf(sent), got)
	assert.Empty(t, peerGot(), "entries waiting in a batch must not go to a peer")
	assert.Empty(t, e.pending("g"))
}

func TestQueuedEntryTakenOverByAnotherConsumerIsSkipped(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	// A hold beat every second. The claim beat runs once at the start and not
	// again within the test, so nothing reclaims the entry from "other".
	scripts := e.streamScripts()
	msgs := e.subscribe(e.subscriber("g", "c", fullBatches, func(c *valkeystream.SubscriberConfig) {
		c.ClaimMinIdle = 3 * time.Second
		c.ClaimInterval = time.Hour
	}))
	sent := e.publishAtOnce(3)
	m := receive(t, msgs) // the other two wait in the loop's queue
	require.NoError(t, e.client.XClaim(ctx, &redis.XClaimArgs{Stream: e.topic, Group: "g", Consumer: "other",
		Messages: []string{receiveEntryID(t, e, sent[1].UUID)}}).Err())
	// The only scripts the loop runs here are hold beats; the second to end
	// after the XCLAIM started after it, and so has seen the new holder.
	beats := scripts.Load()
	waitUntil(t, "two hold beats after the XCLAIM", func() bool { return scripts.Load() >= beats+2 })
	m.Ack()
	next := receive(t, msgs)
	assert.Equal(t, sent[2].UUID, next.UUID, "an entry another consumer holds is not delivered here")
	next.Ack()
	expectNothing(t, msgs, 300*time.Millisecond)
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "other", p[0].Consumer)
}

func TestQueuedEntryWhoseBodyIsDeletedIsAcknowledgedNotDelivered(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	sub := e.subscriber("g", "c", fullBatches, shortClaim)
	msgs := e.subscribe(sub)
	sent := e.publishAtOnce(3)
	m := receive(t, msgs)
	require.NoError(t, e.client.XDel(ctx, e.topic, receiveEntryID(t, e, sent[1].UUID)).Err())
	waitUntil(t, "a hold beat notices the deleted body", func() bool { return sub.Stats().MissingBodies == 1 })
	m.Ack()
	next := receive(t, msgs)
	assert.Equal(t, sent[2].UUID, next.UUID)
	next.Ack()
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(1), sub.Stats().MissingBodies)
	assert.Empty(t, e.pending("g"))
}

// An entry waiting to be handed over that a hold beat finds held by another
// consumer is not delivered: that consumer delivers it.
func TestEntryTakenOverBeforeHandOverIsNotDelivered(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	scripts := e.streamScripts()
	// A hold beat every second; the claim beat runs once at the start only.
	msgs := e.subscribe(e.subscriber("g", "c", fullBatches, func(c *valkeystream.SubscriberConfig) {
		c.ClaimMinIdle = 3 * time.Second
		c.ClaimInterval = time.Hour
	}))
	sent := e.publishAtOnce(2)
	// Nobody takes the first message yet: the loop holds it, waiting to hand
	// it over, and the second in its queue.
	waitUntil(t, "both entries fetched", func() bool { return len(e.pending("g")) == 2 })
	require.NoError(t, e.client.XClaim(ctx, &redis.XClaimArgs{Stream: e.topic, Group: "g", Consumer: "other",
		Messages: []string{receiveEntryID(t, e, sent[0].UUID)}}).Err())
	// The second hold beat to end after the XCLAIM started after it.
	beats := scripts.Load()
	waitUntil(t, "two hold beats after the XCLAIM", func() bool { return scripts.Load() >= beats+2 })
	m := receive(t, msgs)
	assert.Equal(t, sent[1].UUID, m.UUID, "the entry another consumer took over is not handed over")
	m.Ack()
	expectNothing(t, msgs, 300*time.Millisecond)
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "other", p[0].Consumer)
}

// With NoReclaim a subscription never claims: the entries of a consumer
// that left stay pending for it, however long they are idle.
func TestNoReclaimNeverClaims(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	e.publish(1)
	gone := e.readAs("g", "gone", 1)
	client, claims := e.commandCounter("xautoclaim")
	msgs := e.subscribe(e.subscriber("g", "peer", shortClaim, onClient(client),
		func(c *valkeystream.SubscriberConfig) { c.ClaimInterval = valkeystream.NoReclaim }))
	// Twenty blocking reads of 50 ms outlast ClaimMinIdle (300 ms) and many
	// beats of ClaimInterval as shortClaim sets it. They go through the
	// subscription's own reader, so the server counts them.
	reads0 := e.serverCalls("xreadgroup")
	reads := func() int64 { return e.serverCalls("xreadgroup") - reads0 }
	waitUntil(t, "twenty reads", func() bool { return reads() >= 20 })
	expectNothing(t, msgs, 100*time.Millisecond)
	// A new entry shows the loop is alive.
	fresh := e.publish(1)
	got := receive(t, msgs)
	assert.Equal(t, fresh[0].UUID, got.UUID, "only the new entry is delivered")
	got.Ack()
	assert.Equal(t, int64(0), claims.Load(), "XAUTOCLAIM calls")
	p := e.pending("g")
	require.NotEmpty(t, p)
	assert.Equal(t, gone[0].ID, p[0].ID)
	assert.Equal(t, "gone", p[0].Consumer, "the idle entry stays with the consumer that left")
}

// Slow handlers share a backlog: a subscription reads ahead only what its
// handler settles soon, so workers with a slow handler split a backlog
// instead of the first taking it all.
func TestSlowHandlersShareABacklog(t *testing.T) {
	testserver.Parallel(t)
	for _, tt := range []struct {
		workers, entries int
		handler          time.Duration
	}{{2, 40, 100 * time.Millisecond}, {4, 200, 50 * time.Millisecond}} {
		t.Run(fmt.Sprintf("%d workers, %d entries, %s", tt.workers, tt.entries, tt.handler), func(t *testing.T) {
			testSlowHandlersShare(t, tt.workers, tt.entries, tt.handler)
		})
	}
}

func testSlowHandlersShare(t *testing.T, workers, entries int, handler time.Duration) {
	e := newEnv(t)
	type worker struct {
		name    string
		claims  *atomic.Int64
		handled atomic.Int64
	}
	var total atomic.Int64
	seen := sync.Map{}
	all := make([]*worker, workers)
	for i := range all {
		w := &worker{name: fmt.Sprintf("w%d", i+1)}
		all[i] = w
		client, claims := e.commandCounter("xautoclaim")
		w.claims = claims
		msgs := e.subscribe(e.subscriber("g", w.name, onClient(client)))
		go func() {
			for m := range msgs {
				time.Sleep(handler) // the handler's work
				if _, dup := seen.LoadOrStore(m.UUID, w.name); dup {
					t.Errorf("message %s handled twice", m.UUID)
				}
				w.handled.Add(1)
				total.Add(1)
				m.Ack()
			}
		}()
	}
	// All are about to read new entries: their drain and first claim beat
	// have returned. (Whether a read blocks already does not matter: before
	// its handler has settled anything, a subscription reads one entry.)
	for _, w := range all {
		waitUntil(t, w.name+" past its first claim", func() bool { return w.claims.Load() >= 1 })
	}
	start := time.Now()
	e.publish(entries)
	waitUntil(t, "all handled", func() bool { return total.Load() == int64(entries) })
	t.Logf("%d entries handled in %s", entries, time.Since(start).Round(time.Millisecond))
	fair := entries / workers
	for _, w := range all {
		got := w.handled.Load()
		t.Logf("%s handled %d of %d", w.name, got, entries)
		assert.GreaterOrEqual(t, got, int64(fair*60/100), "%s's share", w.name)
		assert.LessOrEqual(t, got, int64(fair*140/100), "%s's share", w.name)
	}
}
