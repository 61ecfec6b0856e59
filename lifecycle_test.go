package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestSubscribeContextEndsOnlyThatSubscription(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	// A short BlockTime makes the cancelled subscription end sooner; the
	// default bounds it at 500 ms.
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.BlockTime = 50 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	ended, err := sub.Subscribe(ctx, e.topic)
	require.NoError(t, err)
	other, err := sub.Subscribe(context.Background(), e.topic+"-other")
	require.NoError(t, err)
	cancel()
	select {
	case _, ok := <-ended:
		assert.False(t, ok)
	case <-time.After(receiveTimeout):
		t.Fatal("the channel of a cancelled subscription was not closed")
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish(e.topic+"-other", msg))
	assert.Equal(t, msg.UUID, receiveAll(t, other, 1)[0])
}

func TestCloseFlushesAcksAndLeavesTheRestPending(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c", fullBatches, func(c *valkeystream.SubscriberConfig) {
		c.AckFlushInterval = time.Minute // only Close or a read sends it
		c.ClaimMinIdle = 2 * time.Minute
	})
	msgs := e.subscribe(sub)
	sent := e.publishAtOnce(2)
	m := receive(t, msgs)
	m.Ack()
	// The loop now waits to hand over the second message, holding the Ack.
	require.NoError(t, sub.Close())
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, receiveEntryID(t, e, sent[1].UUID), p[0].ID)
	_, open := <-msgs
	assert.False(t, open, "Close closes the channel")
}

func TestCloseIsIdempotentAndRacesSubscribeSafely(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	// A short BlockTime keeps the twenty Closes quick; the default works too.
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.BlockTime = 20 * time.Millisecond })
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs, err := sub.Subscribe(context.Background(), fmt.Sprintf("%s-%d", e.topic, i))
			if err != nil {
				assert.ErrorIs(t, err, valkeystream.ErrSubscriberClosed)
				return
			}
			for range msgs { //nolint:revive // drain until closed
			}
		}()
	}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, sub.Close())
		}()
	}
	wg.Wait()
	assert.NoError(t, sub.Close())
	_, err := sub.Subscribe(context.Background(), e.topic)
	assert.ErrorIs(t, err, valkeystream.ErrSubscriberClosed)
}

// TestCloseLeavesNoGoroutine stays serial (no testserver.Parallel): it counts
// the goroutines of the whole process, and Go runs the serial tests before
// it lets the parallel ones start.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	srv := testserver.Start(t)
	// Goroutines of other tests (the universal suite leaves some
	// subscribers open) are told apart by id: ids only grow.
	firstID := nextGoroutineID()

	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Start: valkeystream.StartHead, CloseClient: true,
	}, nil)
	require.NoError(t, err)
	fanOut, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, Start: valkeystream.StartNew}, nil)
	require.NoError(t, err)
	for i := range 3 {
		_, err := sub.Subscribe(context.Background(), fmt.Sprintf("leak-%d", i))
		require.NoError(t, err)
		_, err = fanOut.Subscribe(context.Background(), fmt.Sprintf("leak-%d", i))
		require.NoError(t, err)
	}
	require.NotEmpty(t, goroutinesSince(firstID), "the check must see the subscriptions' goroutines")
	require.NoError(t, fanOut.Close())
	require.NoError(t, sub.Close())

	// Close has returned, so no goroutine started since may run code of
	// this package or of the client any more. Exited goroutines can take a
	// moment to leave the runtime's list.
	var leaked []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked = goroutinesSince(firstID)
		if len(leaked) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the poll of a wait for the goroutines to end
	}
	assert.Empty(t, leaked, "goroutines left after Close")
}

// nextGoroutineID returns an id no goroutine that exists now has.
func nextGoroutineID() int {
	maxID := 0
	for _, g := range goroutineStacks() {
		maxID = max(maxID, goroutineID(g))
	}
	return maxID + 1
}

// goroutinesSince returns the stacks of goroutines with an id of at least
// first that run code of this package or of go-redis, other than tests.
func goroutinesSince(first int) []string {
	var found []string
	for _, g := range goroutineStacks() {
		if goroutineID(g) < first || strings.Contains(g, "_test.go") {
			continue
		}
		if strings.Contains(g, "echomq/valkeystream.") || strings.Contains(g, "redis/go-redis") {
			found = append(found, g)
		}
	}
	return found
}

func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineID reads the id from a stack's first line, "goroutine 12 [...]".
func goroutineID(stack string) int {
	var id int
	_, _ = fmt.Sscanf(stack, "goroutine %d ", &id)
	return id
}

func TestConsumerNamesOfConcurrentSubscriptionsDiffer(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	// One entry per read, so that each subscription gets one of the two.
	sub := e.subscriber("g", "host", func(c *valkeystream.SubscriberConfig) { c.BatchSize = 1 })
	a := e.subscribe(sub)
	b := e.subscribe(sub)
	e.publish(2)
	ma, mb := receive(t, a), receive(t, b)
	names := []string{ma.Metadata.Get(valkeystream.MetadataConsumer), mb.Metadata.Get(valkeystream.MetadataConsumer)}
	assert.ElementsMatch(t, []string{"host", "host-2"}, names)
	ma.Ack()
	mb.Ack()
}

func TestDefaultConsumerNameIsTheHostName(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	host, err := os.Hostname()
	require.NoError(t, err)
	e.publish(1)
	m := receive(t, e.subscribe(e.subscriber("g", "")))
	assert.Equal(t, host, m.Metadata.Get(valkeystream.MetadataConsumer))
	m.Ack()
}

func TestAckJustBeforeCloseIsSent(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	for i := range 20 {
		e.publish(1)
		sub := e.subscriber("g", "c")
		m := receive(t, e.subscribe(sub))
		m.Ack()
		require.NoError(t, sub.Close())
		require.Empty(t, e.pending("g"), "round %d: an Ack made before Close must reach the server", i)
	}
}

// A Close that ends a Subscribe still running its door makes that Subscribe
// return ErrSubscriberClosed, not the door's cancelled call.
func TestCloseDuringSubscribeReturnsErrSubscriberClosed(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	client := newClient(t, e.srv)
	inDoor := make(chan struct{})
	client.AddHook(pipelineHook(func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			if cmds[0].Name() != "xgroup" {
				return next(ctx, cmds)
			}
			close(inDoor)
			<-ctx.Done() // held until Close cancels the subscription
			for _, cmd := range cmds {
				cmd.SetErr(ctx.Err())
			}
			return ctx.Err()
		}
	}))
	sub := e.subscriber("g", "c", onClient(client))
	done := make(chan error, 1)
	go func() {
		_, err := sub.Subscribe(context.Background(), e.topic)
		done <- err
	}()
	<-inDoor
	require.NoError(t, sub.Close())
	err := <-done
	assert.ErrorIs(t, err, valkeystream.ErrSubscriberClosed)
	var doorErr *valkeystream.GroupCreateError
	assert.False(t, errors.As(err, &doorErr), "got %v, want no door error", err)
}

func TestSubscribeInitializeAfterClose(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	for _, group := range []string{"g", ""} {
		sub := e.subscriber(group, "c")
		require.NoError(t, sub.SubscribeInitialize(e.topic))
		require.NoError(t, sub.Close())
		assert.ErrorIs(t, sub.SubscribeInitialize(e.topic), valkeystream.ErrSubscriberClosed, "group %q", group)
	}
}

// Close lets the message in a handler's hands finish within CloseGrace: its
// context stays alive, its Ack is sent, and the entries read ahead are
// handed back, idle, with their delivery counts unchanged.
func TestCloseWaitsForTheMessageInFlightAndHandsBackTheRest(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	sub := e.subscriber("g", "c", fullBatches)
	msgs := e.subscribe(sub)
	sent := e.publishAtOnce(3)
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)

	ctxAliveAtAck := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // the time is the scenario: the handler is still working when Close starts
		ctxAliveAtAck <- m.Context().Err()
		m.Ack()
	}()
	require.NoError(t, sub.Close())
	assert.NoError(t, <-ctxAliveAtAck, "the message's context lives until it is settled")
	assert.Error(t, m.Context().Err(), "and ends after")

	p, err := e.client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.topic, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	require.Len(t, p, 2, "the Ack made during Close was sent; the two read ahead are pending")
	for i, entry := range p {
		assert.Equal(t, receiveEntryID(t, e, sent[i+1].UUID), entry.ID)
		assert.Equal(t, int64(1), entry.RetryCount, "handing back does not grow the count")
		assert.Greater(t, entry.Idle, 24*time.Hour, "handed back entries look idle to every peer")
	}
}

// Entries a closing subscription hands back go to a live peer on its next
// claim beat, not after ClaimMinIdle (30 s by default).
func TestHandedBackEntriesGoToAPeerAtItsNextBeat(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	leaving := e.subscriber("g", "leaving", fullBatches)
	msgs := e.subscribe(leaving)
	sent := e.publishAtOnce(10)
	m := receive(t, msgs)
	// How many the loop read ahead depends on how fast the warm-up went;
	// those are handed back (a read after the Ack may add more).
	readAhead := leaving.Stats().ReadAhead
	require.Positive(t, readAhead, "entries read ahead")
	m.Ack()
	require.NoError(t, leaving.Close())

	peer := e.subscriber("g", "peer", func(c *valkeystream.SubscriberConfig) { c.ClaimInterval = 100 * time.Millisecond })
	peerMsgs := e.subscribe(peer)
	var got []string
	var claimed int64
	for range 9 {
		m := receive(t, peerMsgs) // within receiveTimeout, shorter than ClaimMinIdle
		switch valkeystream.DeliveryCount(m) {
		case 2: // read by the leaving consumer, handed back, claimed by the peer
			claimed++
		case 1: // never read by the leaving consumer
		default:
			t.Errorf("message %s delivered with count %d, want 1 or 2", m.UUID, valkeystream.DeliveryCount(m))
		}
		got = append(got, m.UUID)
		m.Ack()
	}
	assert.GreaterOrEqual(t, claimed, readAhead, "handed back entries reached the peer")
	assert.ElementsMatch(t, uuidsOf(sent[1:]), got)
	require.NoError(t, peer.Close())
	assert.Empty(t, e.pending("g"))
}

// A router closed while a handler works lets it finish and sends its Ack:
// nothing is left pending, so a restart redelivers nothing. (With
// NoCloseGrace the entry stays pending.)
func TestRouterCloseDuringAHandlerRedeliversNothing(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	started := make(chan struct{}, 1)
	var handled atomic.Int64
	stop := e.runRouter(e.subscriber("g", "c"), func(msg *message.Message) error {
		started <- struct{}{}
		time.Sleep(500 * time.Millisecond) // the time is the scenario: the router closes during the handling
		handled.Add(1)
		return nil
	})
	e.publish(1)
	select {
	case <-started:
	case <-time.After(receiveTimeout):
		t.Fatal("the handler never started")
	}
	stop()
	assert.Equal(t, int64(1), handled.Load())
	assert.Empty(t, e.pending("g"), "the Ack made while the router closed was sent")
}

// Close ends a blocked read at once: an idle subscription with a one-minute
// BlockTime closes long before the read would have ended by itself.
func TestCloseEndsABlockedReadAtOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	client, reads := e.commandCounter("xreadgroup")
	sub := e.subscriber("g", "c", onClient(client), func(c *valkeystream.SubscriberConfig) {
		c.BlockTime = time.Minute
		c.ClaimMinIdle = 2 * time.Minute
	})
	msgs := e.subscribe(sub)
	// The drain has returned; the blocking read goes through the
	// subscription's own client, which the hook does not see.
	waitUntil(t, "the drain", func() bool { return reads.Load() >= 1 })
	waitUntil(t, "the blocking read on the server", func() bool { return e.blockedReads() == 1 })
	start := time.Now()
	require.NoError(t, sub.Close())
	took := time.Since(start)
	t.Logf("Close of an idle subscription took %s", took)
	assert.Less(t, took, 30*time.Second, "Close waited out the blocking read")
	_, open := <-msgs
	assert.False(t, open)
}
