package compat

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
)

// TestIncumbentEntriesReadAsTheyWere: 1000 entries written by
// watermill-redisstream's Publisher are read by a valkeystream Subscriber
// with its default Unmarshaler as the messages that were published, and as
// watermill-redisstream itself decodes them, in stream order; nothing is
// dead-lettered.
func TestIncumbentEntriesReadAsTheyWere(t *testing.T) {
	topic := topicName()
	published := testMessages(1000, 1)
	require.NoError(t, newIncumbentPublisher(t).Publish(topic, published...))

	// What watermill-redisstream's own Unmarshaller makes of each entry.
	stored := entries(t, newClient(t), topic)
	require.Len(t, stored, len(published))
	theirs := make([]*message.Message, len(stored))
	for i, e := range stored {
		msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
		require.NoError(t, err, "entry %s", e.ID)
		theirs[i] = msg
	}

	sub := newSubscriber(t, "billing", "worker")
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	for i, want := range published {
		got := receive(t, msgs)
		got.Ack()
		requireSameMessage(t, want, got, fmt.Sprintf("message %d against the published one", i))
		requireSameMessage(t, theirs[i], got, fmt.Sprintf("message %d against watermill-redisstream's decoding", i))
		require.Equal(t, stored[i].ID, got.Metadata.Get(valkeystream.MetadataEntryID), "message %d: stream order", i)
	}
	require.NoError(t, sub.Close())

	stats := sub.Stats()
	assert.Equal(t, int64(0), stats.InvalidEntries, "nothing is undecodable")
	assert.Equal(t, int64(len(published)), stats.Acked)
	c := newClient(t)
	dead, err := c.Exists(context.Background(), topic+valkeystream.DefaultDeadLetterSuffix).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), dead, "no dead-letter stream was written")
	pending, err := c.XPending(context.Background(), topic, "billing").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), pending.Count)
}

// TestMixedStreamReadsInOrder: entries of both layouts, from both libraries,
// interleaved on one stream, are read in stream order.
func TestMixedStreamReadsInOrder(t *testing.T) {
	topic := topicName()
	published := testMessages(120, 2)
	incumbent := newIncumbentPublisher(t)
	ours := newPublisher(t, valkeystream.DefaultMarshaler{})
	oursOld := newPublisher(t, valkeystream.RedisstreamMarshaler{})
	for i, msg := range published {
		var err error
		switch i % 3 {
		case 0:
			err = incumbent.Publish(topic, msg)
		case 1:
			if len(msg.Metadata) > 0 && (msg.Metadata["uuid"] != "" || msg.Metadata["payload"] != "") {
				t.Fatalf("test message %d has a metadata key reserved by DefaultMarshaler", i)
			}
			err = ours.Publish(topic, msg)
		case 2:
			err = oursOld.Publish(topic, msg)
		}
		require.NoError(t, err, "publishing message %d", i)
	}

	sub := newSubscriber(t, "g", "worker")
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	for i, want := range published {
		got := receive(t, msgs)
		got.Ack()
		requireSameMessage(t, want, got, fmt.Sprintf("message %d", i))
	}
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(0), sub.Stats().InvalidEntries)
}

// TestIncumbentSubscriberReadsRedisstreamMarshaler: what a valkeystream
// Publisher writes with RedisstreamMarshaler, watermill-redisstream's
// Subscriber reads, every entry, as the message that was published.
func TestIncumbentSubscriberReadsRedisstreamMarshaler(t *testing.T) {
	topic := topicName()
	published := testMessages(300, 3)
	pub := newPublisher(t, valkeystream.RedisstreamMarshaler{})
	for i := 0; i < len(published); i += 50 { // several messages per call
		require.NoError(t, pub.Publish(topic, published[i:i+50]...))
	}

	sub := newIncumbentSubscriber(t, "old-readers")
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	for i, want := range published {
		got := receive(t, msgs)
		got.Ack()
		requireSameMessage(t, want, got, fmt.Sprintf("message %d", i))
	}
	// The incumbent sends an Ack after the handler returns; Close may cut
	// the last one short, so wait for it first.
	waitNothingPending(t, topic, "old-readers")
	require.NoError(t, sub.Close())
}

// TestIncumbentSubscriberStopsOnTheDefaultLayout shows why
// RedisstreamMarshaler exists: watermill-redisstream's Subscriber ends its
// subscription at the first entry of DefaultMarshaler's layout.
func TestIncumbentSubscriberStopsOnTheDefaultLayout(t *testing.T) {
	topic := topicName()
	require.NoError(t, newPublisher(t, valkeystream.DefaultMarshaler{}).Publish(topic, message.NewMessage("new-layout", nil)))

	sub := newIncumbentSubscriber(t, "old-readers")
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	select {
	case msg, ok := <-msgs:
		require.False(t, ok, "got message %v, want the incumbent's channel closed", msg)
	case <-time.After(receiveTimeout):
		t.Fatalf("the incumbent's channel stayed open for %s", receiveTimeout)
	}
}

// TestMixedFleetSharesAGroup is the rolling phase: publishers write the old
// layout, and watermill-redisstream and valkeystream consumers read the same
// group at once. Every message is handled, once, and nothing is
// dead-lettered.
func TestMixedFleetSharesAGroup(t *testing.T) {
	topic := topicName()
	published := testMessages(400, 4)

	old := newIncumbentSubscriber(t, "billing")
	oldMsgs, err := old.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	ours := newSubscriber(t, "billing", "new-1", func(c *valkeystream.SubscriberConfig) {
		c.ClaimMinIdle = time.Minute // as long as the incumbent's MaxIdleTime: neither side claims a live entry
	})
	ourMsgs, err := ours.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	pub := newPublisher(t, valkeystream.RedisstreamMarshaler{})
	for i := 0; i < len(published); i += 20 {
		require.NoError(t, pub.Publish(topic, published[i:i+20]...))
	}

	handled, dups := collect(t, len(published), oldMsgs, ourMsgs)
	// Neither side takes a live entry from the other within ClaimMinIdle
	// and MaxIdleTime (a minute each), so nothing comes twice.
	assert.Empty(t, dups, "messages delivered twice")
	for _, want := range published {
		got, ok := handled[want.UUID]
		require.True(t, ok, "message %s was not handled", want.UUID)
		requireSameMessage(t, want, got.msg, "message")
	}
	assert.Positive(t, ours.Stats().Delivered, "the valkeystream consumer took part")
	waitNothingPending(t, topic, "billing")
	require.NoError(t, ours.Close())
	assert.Equal(t, int64(0), ours.Stats().InvalidEntries)
}

// TestGroupTakenOverFromIncumbentConsumers: two watermill-redisstream
// consumers (with their default random names) handle part of a stream and
// stop, each leaving entries pending; valkeystream consumers that start on
// the same group reclaim those entries once idle, and read the rest. Every
// message is handled, none that the old consumers acknowledged comes again,
// nothing is left pending or dead-lettered.
func TestGroupTakenOverFromIncumbentConsumers(t *testing.T) {
	ctx := context.Background()
	topic := topicName()
	published := testMessages(200, 5)
	require.NoError(t, newIncumbentPublisher(t).Publish(topic, published...))

	handledByIncumbent := map[string]bool{}
	for range 2 {
		sub := newIncumbentSubscriber(t, "billing")
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		for range 30 {
			msg := receive(t, msgs)
			handledByIncumbent[msg.UUID] = true
			msg.Ack()
		}
		receive(t, msgs) // taken, never acknowledged: the process dies
		require.NoError(t, sub.Close())
	}

	c := newClient(t)
	summary, err := c.XPending(ctx, topic, "billing").Result()
	require.NoError(t, err)
	require.GreaterOrEqual(t, summary.Count, int64(2), "the incumbent consumers left entries pending")
	require.Len(t, summary.Consumers, 2, "pending for two incumbent consumers: %v", summary.Consumers)

	var subs []*valkeystream.Subscriber
	var channels []<-chan *message.Message
	for i := range 2 {
		sub := newSubscriber(t, "billing", fmt.Sprint("new-", i+1), func(c *valkeystream.SubscriberConfig) {
			c.ClaimMinIdle = 2 * time.Second
			c.ClaimInterval = 100 * time.Millisecond
		})
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		subs = append(subs, sub)
		channels = append(channels, msgs)
	}
	rest := len(published) - len(handledByIncumbent)
	handled, dups := collect(t, rest, channels...)
	// At least once: a valkeystream consumer stalled past ClaimMinIdle on a
	// loaded machine may lose an entry to its peer, which handles it again.
	t.Logf("%d messages handled twice by the valkeystream consumers", len(dups))
	for _, want := range published {
		got, ok := handled[want.UUID]
		switch {
		case handledByIncumbent[want.UUID]:
			assert.False(t, ok, "message %s was handled by the incumbent and again by valkeystream", want.UUID)
		case !ok:
			t.Errorf("message %s was never handled", want.UUID)
		default:
			requireSameMessage(t, want, got.msg, "message")
		}
	}

	var reclaimed, invalid int64
	for _, sub := range subs {
		require.NoError(t, sub.Close())
		reclaimed += sub.Stats().Reclaimed
		invalid += sub.Stats().InvalidEntries
	}
	assert.GreaterOrEqual(t, reclaimed, summary.Count, "every entry the incumbents left pending was reclaimed")
	assert.Equal(t, int64(0), invalid)
	after, err := c.XPending(ctx, topic, "billing").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), after.Count, "nothing is left pending")
}

type handledMessage struct {
	msg *message.Message
	by  int // index of the channel it came from
}

// collect acknowledges messages from every channel until n distinct UUIDs
// arrived, and returns them and the UUIDs that arrived more than once.
func collect(t *testing.T, n int, channels ...<-chan *message.Message) (map[string]handledMessage, []string) {
	t.Helper()
	var mu sync.Mutex
	handled := map[string]handledMessage{}
	var dups []string
	finished := false
	done := make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, ch := range channels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case msg, ok := <-ch:
					if !ok {
						return
					}
					mu.Lock()
					if _, seen := handled[msg.UUID]; seen {
						dups = append(dups, msg.UUID)
					}
					handled[msg.UUID] = handledMessage{msg: msg, by: i}
					if len(handled) == n && !finished {
						finished = true
						close(done)
					}
					mu.Unlock()
					msg.Ack()
				}
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(receiveTimeout):
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, handled, n, "distinct messages handled within %s", receiveTimeout)
	return handled, dups
}

// waitNothingPending waits until group holds no pending entry of key.
func waitNothingPending(t *testing.T, key, group string) {
	t.Helper()
	c := newClient(t)
	deadline := time.Now().Add(receiveTimeout)
	for {
		summary, err := c.XPending(context.Background(), key, group).Result()
		require.NoError(t, err)
		if summary.Count == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries still pending in group %s after %s: %v", summary.Count, group, receiveTimeout, summary.Consumers)
		}
		time.Sleep(20 * time.Millisecond) // the poll of a wait for nothing pending
	}
}
