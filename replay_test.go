package valkeystream_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// replayDeadLetter appends the one dead letter of deadStream to stream as
// `valkeystream dead replay` does: the message's own fields, without the
// dead-letter keys, for group (every group when empty), and deletes it.
func replayDeadLetter(t *testing.T, client *redis.Client, deadStream, stream, group string) {
	t.Helper()
	ctx := context.Background()
	letters, err := client.XRange(ctx, deadStream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, letters, 1, "dead letters in %s", deadStream)
	var values []any
	for k, v := range letters[0].Values {
		if k == valkeystream.MetadataError || strings.HasPrefix(k, "valkeystream_original_") {
			continue
		}
		values = append(values, k, v)
	}
	if group != "" {
		values = append(values, valkeystream.MetadataReplayGroup, group)
	}
	require.NoError(t, client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err())
	require.NoError(t, client.XDel(ctx, deadStream, letters[0].ID).Err())
}

// A service as users build it: billing (Deduplicator outermost, then
// DeadLetter) and shipping, a group each. A poison order is dead-lettered by
// billing; its rule is fixed; the dead letter is replayed. Billing charges
// it exactly once (the dead-lettering left no done mark to skip the replay
// as a duplicate), and shipping, which shipped it already, does not get it
// again (the replay is for billing only).
func TestAReplayedDeadLetterIsHandledOnceByTheGroupThatGaveUp(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	dedup, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: e.client}, testLogger())
	require.NoError(t, err)
	deadLetter := e.deadLetter(valkeystream.DeadLetterConfig{Publisher: e.publisher(), MaxDeliveries: 1})

	var fixed atomic.Bool
	var mu sync.Mutex
	charged, shipped := map[string]int{}, map[string]int{}
	billing := e.subscriber("billing", "b", fastRedelivery)
	shipping := e.subscriber("shipping", "s", fastRedelivery)
	e.runRouter(billing, func(m *message.Message) error {
		if string(m.Payload) == "poison" && !fixed.Load() {
			return errors.New("no rule for this order")
		}
		mu.Lock()
		charged[m.UUID]++
		mu.Unlock()
		return nil
	}, dedup.Middleware, deadLetter)
	e.runRouter(shipping, func(m *message.Message) error {
		mu.Lock()
		shipped[m.UUID]++
		mu.Unlock()
		return nil
	})

	orders := e.publish(3)
	poison := message.NewMessage("poison-order", []byte("poison"))
	require.NoError(t, e.publisher().Publish(e.topic, poison))
	deadStream := e.topic + valkeystream.DefaultDeadLetterSuffix
	require.Eventually(t, func() bool { return e.client.XLen(ctx, deadStream).Val() == 1 }, receiveTimeout, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(charged) == 3 && len(shipped) == 4
	}, receiveTimeout, 10*time.Millisecond)
	// The Deduplicator counts once DeadLetter has returned, after the dead
	// letter is in the stream.
	require.Eventually(t, func() bool { return dedup.Stats().GivenUp == 1 }, receiveTimeout, 10*time.Millisecond,
		"the dead-lettered handling is counted as given up, not marked done")

	fixed.Store(true)
	replayDeadLetter(t, e.client, deadStream, e.topic, "billing")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return charged[poison.UUID] == 1
	}, receiveTimeout, 10*time.Millisecond, "the replay must be charged")
	require.Eventually(t, func() bool { return shipping.Stats().NotForThisGroup == 1 }, receiveTimeout, 10*time.Millisecond,
		"shipping acknowledges the replay for billing without delivering it")
	require.Eventually(t, func() bool { return len(e.pending("billing")) == 0 && len(e.pending("shipping")) == 0 }, receiveTimeout, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // anything handled twice would come now
	mu.Lock()
	defer mu.Unlock()
	for _, o := range orders {
		require.Equal(t, 1, charged[o.UUID], "order %s charged", o.UUID)
		require.Equal(t, 1, shipped[o.UUID], "order %s shipped", o.UUID)
	}
	require.Equal(t, 1, charged[poison.UUID], "the poison order, charged once its rule was fixed")
	require.Equal(t, 1, shipped[poison.UUID], "the poison order, shipped once before the replay")
	require.Zero(t, billing.Stats().NotForThisGroup)
}

// Replayed to every group (no MetadataReplayGroup), a dead letter reaches
// the other groups too, which handled it before: a Deduplicator's done mark
// from that handling is what keeps them from handling it twice.
func TestADeadLetterReplayedToEveryGroupReachesThemAll(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	other := e.subscriber("other", "o")
	fromOther := e.subscribe(other)
	sent := e.publish(1)
	require.Equal(t, sent[0].UUID, receiveAll(t, fromOther, 1)[0])
	dead := e.topic + ".dead"
	pub := e.publisher()
	require.NoError(t, pub.Publish(e.topic+".dead", sent[0]))
	replayDeadLetter(t, e.client, dead, e.topic, "")
	m := receive(t, fromOther)
	require.Equal(t, sent[0].UUID, m.UUID)
	m.Ack()
	require.Zero(t, other.Stats().NotForThisGroup)
}
