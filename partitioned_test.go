package valkeystream_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
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
	"github.com/echomq/valkeystream/internal/partition"
	"github.com/echomq/valkeystream/internal/testserver"
)

func keyed(key string, seq int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(seq)))
	if key != "" {
		m.Metadata.Set(valkeystream.MetadataPartitionKey, key)
	}
	m.Metadata.Set("seq", fmt.Sprint(seq))
	return m
}

func TestPublishRoutesByPartitionKey(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 8
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: n} })
	var msgs []*message.Message
	for seq := range 40 {
		msgs = append(msgs, keyed(fmt.Sprint("key-", seq%10), seq))
	}
	require.NoError(t, pub.Publish(e.topic, msgs[:20]...))
	for _, m := range msgs[20:] {
		require.NoError(t, pub.Publish(e.topic, m))
	}
	streams, err := valkeystream.PartitionStreams(e.topic, n)
	require.NoError(t, err)
	total := 0
	for i, stream := range streams {
		last := map[string]int{}
		for _, m := range e.stored(stream) {
			key := m.Metadata.Get(valkeystream.MetadataPartitionKey)
			assert.Equal(t, i, valkeystream.PartitionOf(key, n), "message of key %s in partition %d", key, i)
			var seq int
			_, _ = fmt.Sscan(m.Metadata.Get("seq"), &seq)
			if prev, ok := last[key]; ok {
				assert.Greater(t, seq, prev, "key %s out of order in partition %d", key, i)
			}
			last[key] = seq
			total++
		}
	}
	assert.Equal(t, 40, total)
	n0, err := e.client.Exists(context.Background(), e.topic).Result()
	require.NoError(t, err)
	assert.Zero(t, n0, "a partitioned topic wrote its plain stream")
}

func TestPublishSpreadsUnkeyedMessagesByUUID(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 4
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: n} })
	var msgs []*message.Message
	for seq := range 400 {
		msgs = append(msgs, keyed("", seq))
	}
	require.NoError(t, pub.Publish(e.topic, msgs...))
	// Published again (a retry after a lost answer): to the same partition.
	require.NoError(t, pub.Publish(e.topic, msgs[7].Copy()))
	streams, err := valkeystream.PartitionStreams(e.topic, n)
	require.NoError(t, err)
	for i, s := range streams {
		l, err := e.client.XLen(context.Background(), s).Result()
		require.NoError(t, err)
		// 100 each on average; a spread this uneven has odds below 1e-6.
		assert.InDelta(t, 100, l, 40, "unkeyed messages in partition %d", i)
	}
	copies := 0
	for _, m := range e.stored(streams[valkeystream.PartitionOf(msgs[7].UUID, n)]) {
		if m.UUID == msgs[7].UUID {
			copies++
		}
	}
	assert.Equal(t, 2, copies, "the copy published again is not in its first copy's partition")
}

// A side that does not declare a partitioned topic partitioned is refused:
// it would write to, or read, a stream no partitioned side touches.
// A side that does not declare a topic partitioned finds its count on the
// server at its first use of the topic, and uses the partitions: the
// Publisher routes by key, the Subscriber owns partitions and delivers each
// key in order. A fan-out subscription is refused (partitions are read by
// groups only).
func TestAnUndeclaredSideDiscoversAPartitionedTopic(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 4
	declared := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: n} })
	publishKeyed(t, declared, e.topic, 10, 0, 1)

	var h handled
	e.runRouter(e.subscriber("g", "c"), func(msg *message.Message) error { h.add(msg); return nil })
	undeclared := e.publisher()
	publishKeyed(t, undeclared, e.topic, 10, 1, 5)
	waitUntil(t, "every message handled", func() bool { return h.count() == 50 })
	h.checkOrder(t, 5)

	streams, err := valkeystream.PartitionStreams(e.topic, n)
	require.NoError(t, err)
	total := int64(0)
	for _, stream := range streams {
		total += e.client.XLen(context.Background(), stream).Val()
	}
	assert.Equal(t, int64(50), total, "messages in the partitions' streams")
	assert.Zero(t, e.client.XLen(context.Background(), e.topic).Val(), "messages in the topic's own stream")

	_, err = e.subscriber("", "").Subscribe(context.Background(), e.topic)
	require.ErrorIs(t, err, valkeystream.ErrPartitionCount, "fan-out")
	assert.ErrorContains(t, err, "set ConsumerGroup")
}

// A count declared in the config is an assertion: another count on the
// server fails the first use, naming both, on either side; a count found
// on the server that is no count fails too.
func TestADeclaredCountIsCheckedAgainstTheServers(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	undeclared := e.publisher()
	require.NoError(t, e.client.Set(context.Background(), e.topic+":partitions", "8", 0).Err())
	four := map[string]int{e.topic: 4}
	err := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = four }).Publish(e.topic, keyed("a", 1))
	require.ErrorIs(t, err, valkeystream.ErrPartitionCount)
	assert.ErrorContains(t, err, "8 partitions")
	_, err = e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.Partitions = four }).Subscribe(context.Background(), e.topic)
	require.ErrorIs(t, err, valkeystream.ErrPartitionCount)
	assert.ErrorContains(t, err, "with 4")

	other := e.topic + "-x"
	require.NoError(t, e.client.Set(context.Background(), other+":partitions", "many", 0).Err())
	err = undeclared.Publish(other, keyed("a", 1))
	require.ErrorIs(t, err, valkeystream.ErrPartitionCount)
	assert.ErrorContains(t, err, `"many"`)
}

// A Subscriber of partitioned topics is not refused for claim settings that
// would not do on a plain topic (ClaimMinIdle below BlockTime, an early
// removal of idle consumers): partitions never claim, so they do not apply.
func TestAPartitionedSubscriptionIgnoresTheClaimFields(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	parts := map[string]int{e.topic: 2}
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = parts })
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.Partitions = parts
		c.BlockTime, c.ClaimMinIdle, c.RemoveIdleConsumersAfter = time.Second, time.Millisecond, 2*time.Millisecond
	})
	var h handled
	e.runRouter(sub, func(msg *message.Message) error { h.add(msg); return nil })
	publishKeyed(t, pub, e.topic, 4, 0, 5)
	waitUntil(t, "every message handled", func() bool { return h.count() == 20 })
	h.checkOrder(t, 5)
}

func TestPartitionCountMismatchIsRefused(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	eight := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: 8} })
	require.NoError(t, eight.Publish(e.topic, keyed("a", 1)))
	four := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = map[string]int{e.topic: 4} })
	err := four.Publish(e.topic, keyed("a", 2))
	require.ErrorIs(t, err, valkeystream.ErrPartitionCount)
	assert.Contains(t, err.Error(), "8 partitions")
	assert.Contains(t, err.Error(), "with 4")
}

func TestPartitionsConfigIsValidated(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	_, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: map[string]int{"orders": 4}}, nil)
	require.NoError(t, err)
	for name, parts := range map[string]map[string]int{
		"zero":      {"orders": 0},
		"too many":  {"orders": valkeystream.MaxPartitions + 1},
		"hash tag":  {"{orders}": 4},
		"empty key": {"": 4},
	} {
		_, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: parts}, nil)
		assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig, name)
		assert.ErrorContains(t, err, "Partitions", name)
	}
}

// partitionedEnv is a test's partitioned topic of n partitions.
func (e *env) partitioned(n int) (pub *valkeystream.Publisher, sub func(consumer string) *valkeystream.Subscriber) {
	e.t.Helper()
	parts := map[string]int{e.topic: n}
	pub = e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = parts })
	sub = func(consumer string) *valkeystream.Subscriber {
		return e.subscriber("g", consumer, fastRedelivery, func(c *valkeystream.SubscriberConfig) {
			c.Partitions = parts
			// A beat of 100 ms, so that moves take little time; a TTL far
			// above a loaded machine's stalls, so that no test loses an
			// ownership it renews (a test of a lapse sets its own).
			c.PartitionOwnerTTL = 2 * time.Second
		})
	}
	return pub, sub
}

// handled is what a partitioned test's handlers saw: per key, the
// sequence numbers of first deliveries, in order.
type handled struct {
	mu    sync.Mutex
	byKey map[string][]int
	seen  map[string]bool // uuid
	twice int
}

func (h *handled) add(msg *message.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byKey == nil {
		h.byKey, h.seen = map[string][]int{}, map[string]bool{}
	}
	if h.seen[msg.UUID] {
		h.twice++
		return
	}
	h.seen[msg.UUID] = true
	seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
	key := msg.Metadata.Get(valkeystream.MetadataPartitionKey)
	h.byKey[key] = append(h.byKey[key], seq)
}

func (h *handled) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seen)
}

// checkOrder fails the test unless every key's first deliveries came in
// publish order, all of them.
func (h *handled) checkOrder(t *testing.T, perKey int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, seqs := range h.byKey {
		for i, seq := range seqs {
			if seq != i {
				t.Fatalf("key %s: first deliveries %v, want 0..%d in order", key, seqs, perKey-1)
			}
		}
		assert.Len(t, seqs, perKey, "deliveries of key %s", key)
	}
}

func publishKeyed(t *testing.T, pub *valkeystream.Publisher, topic string, keys, from, to int) {
	t.Helper()
	for seq := from; seq < to; seq++ {
		batch := make([]*message.Message, 0, keys)
		for k := range keys {
			batch = append(batch, keyed(fmt.Sprint("key-", k), seq))
		}
		require.NoError(t, pub.Publish(topic, batch...))
	}
}

func TestAPartitionedTopicKeepsPerKeyOrderAcrossSubscriptions(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, newSub := e.partitioned(8)
	var h handled
	var inFlight sync.Map // partition -> handling now
	var overlap atomic.Int64
	handler := func(msg *message.Message) error {
		p := msg.Metadata.Get(valkeystream.MetadataPartition)
		if _, busy := inFlight.LoadOrStore(p, true); busy {
			overlap.Add(1)
		}
		time.Sleep(time.Millisecond) // the time is the scenario: a handling that overlaps would show
		inFlight.Delete(p)
		h.add(msg)
		return nil
	}
	a, b := newSub("a"), newSub("b")
	e.runRouter(a, handler)
	publishKeyed(t, pub, e.topic, 20, 0, 10)
	waitUntil(t, "a third of the messages handled", func() bool { return h.count() >= 60 })
	waitUntil(t, "a owns every partition", func() bool { return len(owned(a)) == 8 })
	e.runRouter(b, handler) // joins: the partitions split 4/4
	publishKeyed(t, pub, e.topic, 20, 10, 20)
	waitUntil(t, "the partitions split 4/4", func() bool { return len(owned(a)) == 4 && len(owned(b)) == 4 })
	// A handling's Ack follows it (the router's, batched by the
	// partition's loop), so nothing pending is waited for too.
	waitUntil(t, "every message handled and acknowledged", func() bool {
		if h.count() != 400 {
			return false
		}
		for _, s := range mustStreams(t, e.topic, 8) {
			if e.pendingCount(s, "g") != 0 {
				return false
			}
		}
		return true
	})
	h.checkOrder(t, 20)
	assert.Zero(t, overlap.Load(), "two messages of one partition in flight at once")
}

// answeredAcks records the entry IDs of the partitions' Acks (their fenced
// script: keys, token, group, then the IDs) that client sent and the
// server answered, whether it acknowledged them or refused them.
func answeredAcks(client *redis.Client) *sync.Map {
	var answered sync.Map
	see := func(cmd redis.Cmder) {
		args := cmd.Args()
		if !isScript(cmd) || cmd.Err() != nil || len(args) < 3 {
			return
		}
		keys, err := strconv.Atoi(fmt.Sprint(args[2]))
		// The other fenced scripts have the member's name third, where
		// the Ack has its first ID.
		if err != nil || len(args) < 3+keys+3 || args[3+keys+1] != "g" || !strings.Contains(fmt.Sprint(args[3+keys+2]), "-") {
			return
		}
		for _, id := range args[3+keys+2:] {
			answered.Store(fmt.Sprint(id), true)
		}
	}
	client.AddHook(processHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			see(cmd)
			return err
		}
	}))
	client.AddHook(pipelineHook(func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			err := next(ctx, cmds)
			for _, cmd := range cmds {
				see(cmd)
			}
			return err
		}
	}))
	return &answered
}

// owned returns the partitions sub's one subscription owns.
func owned(sub *valkeystream.Subscriber) []int {
	for _, st := range sub.Subscriptions() {
		if !st.Ended {
			return st.Owned
		}
	}
	return nil
}

func mustStreams(t *testing.T, topic string, n int) []string {
	t.Helper()
	s, err := valkeystream.PartitionStreams(topic, n)
	require.NoError(t, err)
	return s
}

// TestAPartitionOwnerCutOffPastItsTTLDeliversNothingMore cuts an owner off
// the server (its bytes held, as a frozen process's) while its handler
// holds a message and its queue holds the next ones, past
// PartitionOwnerTTL: another subscription takes the partition over,
// handles the held message first and the next ones in order. The old owner
// hands over nothing from its queue, and healed, nothing more of the
// partition; its late Ack takes nothing from the new owner.
func TestAPartitionOwnerCutOffPastItsTTLDeliversNothingMore(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, newSub := e.partitioned(1)
	proxy := testserver.NewProxy(t, e.srv.Addr())
	// Its calls wait out the cut: the late Ack sent while cut off gets its
	// answer after the heal.
	cutClient := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = cutClient.Close() })
	answered := answeredAcks(cutClient)
	a := e.subscriber("g", "a", fastRedelivery, onClient(cutClient), fullBatches, func(c *valkeystream.SubscriberConfig) {
		c.Partitions = map[string]int{e.topic: 1}
		c.PartitionOwnerTTL = 500 * time.Millisecond
	})
	msgsA := e.subscribeTo(a, e.topic)
	publishKeyed(t, pub, e.topic, 1, 0, 5)
	held := receive(t, msgsA)
	require.Equal(t, "0", held.Metadata.Get("seq"))

	proxy.Cut()
	layout, err := partition.NewLayout(e.topic, 1)
	require.NoError(t, err)
	waitUntil(t, "a's owner record lapsed", func() bool {
		return e.client.Exists(context.Background(), layout.Keys(0, "g").Owner).Val() == 0
	})
	b := newSub("b")
	msgsB := e.subscribeTo(b, e.topic)
	first := receive(t, msgsB)
	require.Equal(t, "0", first.Metadata.Get("seq"), "the new owner's first delivery: the entry the old one held")
	assert.Equal(t, "2", first.Metadata.Get(valkeystream.MetadataDeliveryCount))

	// Still cut off, a settles the held message: its next ones, read ahead
	// into its queue, must not be handed over (its ownership has lapsed by
	// its own clock), although no server call stands in the way.
	held.Ack()
	select {
	case m, ok := <-msgsA:
		if ok {
			t.Fatalf("the cut-off owner delivered seq %s from its queue after its ownership lapsed", m.Metadata.Get("seq"))
		}
	case <-time.After(500 * time.Millisecond):
	}
	proxy.Heal() // its late Ack reaches the server: fenced, it takes nothing from b
	stream := mustStreams(t, e.topic, 1)[0]
	heldID := held.Metadata.Get(valkeystream.MetadataEntryID)
	waitUntil(t, "the server answered a's late Ack", func() bool { _, ok := answered.Load(heldID); return ok })
	p, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	firstID := first.Metadata.Get(valkeystream.MetadataEntryID)
	pendingFirst := slices.IndexFunc(p, func(x redis.XPendingExt) bool { return x.ID == firstID && x.Consumer == "b" })
	require.GreaterOrEqual(t, pendingFirst, 0, "the old owner's late Ack took entry %s from the new owner: pending %v", firstID, p)
	first.Ack()
	seqs := []string{"0"}
	for range 4 {
		m := receive(t, msgsB)
		seqs = append(seqs, m.Metadata.Get("seq"))
		m.Ack()
	}
	assert.Equal(t, []string{"0", "1", "2", "3", "4"}, seqs, "the new owner's deliveries")
	publishKeyed(t, pub, e.topic, 1, 5, 10)
	for seq := 5; seq < 10; seq++ {
		m := receive(t, msgsB)
		assert.Equal(t, strconv.Itoa(seq), m.Metadata.Get("seq"))
		m.Ack()
	}
	select {
	case m, ok := <-msgsA:
		if ok {
			t.Fatalf("the cut-off owner delivered seq %s after it lost the partition", m.Metadata.Get("seq"))
		}
	case <-time.After(time.Second):
	}
	waitUntil(t, "a found its ownership lost", func() bool { return a.PartitionStats().Fenced >= 1 || len(owned(a)) == 0 })
	assert.Equal(t, []int{0}, owned(b))
}

// TestASubscriptionOwningMorePartitionsThanItsPoolDelivers owns 16
// partitions through a client of 4 connections: its blocking waits must
// leave connections to its reads, Acks and renewals.
func TestASubscriptionOwningMorePartitionsThanItsPoolDelivers(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	small := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), PoolSize: 4})
	t.Cleanup(func() { _ = small.Close() })
	parts := map[string]int{e.topic: 16}
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = parts })
	sub := e.subscriber("g", "c", onClient(small), func(c *valkeystream.SubscriberConfig) {
		c.Partitions = parts
		// Short enough that renewals starved of connections for a few
		// BlockTimes lapse, long enough for a loaded machine's stalls.
		c.PartitionOwnerTTL = 2 * time.Second
	})
	var h handled
	e.runRouter(sub, func(msg *message.Message) error { h.add(msg); return nil })
	waitUntil(t, "every partition owned", func() bool { return len(owned(sub)) == 16 })
	publishKeyed(t, pub, e.topic, 40, 0, 5)
	waitUntil(t, "every message handled", func() bool { return h.count() == 200 })
	h.checkOrder(t, 5)
	assert.Zero(t, sub.PartitionStats().Fenced, "an ownership lapsed for want of a connection")
}

// TestAClosedSubscriptionsPartitionsMoveAtOnce closes one of two
// subscriptions while messages flow: its in-flight messages are settled
// first, the other takes its partitions, and every key stays in order.
func TestAClosedSubscriptionsPartitionsMoveAtOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	pub, newSub := e.partitioned(8)
	var h handled
	handler := func(msg *message.Message) error {
		time.Sleep(2 * time.Millisecond) // the time is the scenario: messages in flight when a closes
		h.add(msg)
		return nil
	}
	a, b := newSub("a"), newSub("b")
	stopA := e.runRouter(a, handler)
	e.runRouter(b, handler)
	waitUntil(t, "the partitions split 4/4", func() bool { return len(owned(a)) == 4 && len(owned(b)) == 4 })
	publishKeyed(t, pub, e.topic, 40, 0, 10)
	waitUntil(t, "some handled", func() bool { return h.count() >= 100 })
	released := a.PartitionStats().Released
	stopA()
	publishKeyed(t, pub, e.topic, 40, 10, 20)
	waitUntil(t, "b owns every partition", func() bool { return len(owned(b)) == 8 })
	waitUntil(t, "every message handled", func() bool { return h.count() == 800 })
	h.checkOrder(t, 20)
	assert.Equal(t, int64(4), a.PartitionStats().Released-released, "a released its 4 partitions on Close")
	assert.Zero(t, a.PartitionStats().Owned, "a still counts partitions it owned")
	assert.Zero(t, a.PartitionStats().Fenced+b.PartitionStats().Fenced)
}

// TestAPartitionedTopicOnAClusterThroughAFailover spreads 12 partitions over
// the 3 masters of a cluster (4 each), and fails over the master of one of
// them (CLUSTER FAILOVER) while messages flow: nothing is lost, and every
// key's first deliveries stay in order.
func TestAPartitionedTopicOnAClusterThroughAFailover(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	ctx := context.Background()
	topic := "parts-" + watermill.NewShortUUID()
	const n, keys, rounds = 12, 48, 30
	streams := mustStreams(t, topic, n)
	perMaster := map[string]int{}
	for _, s := range streams {
		master, _, err := c.SlotOwner(ctx, s)
		require.NoError(t, err)
		perMaster[master]++
	}
	require.Len(t, perMaster, 3, "masters of the partitions: %v", perMaster)
	for m, k := range perMaster {
		assert.Equal(t, 4, k, "partitions on master %s", m)
	}

	// Declared once, as the valkeystream command does: the Publisher and
	// the Subscriber find the count on the cluster (its key is in another
	// slot than the topic's).
	pubClient, subClient := clusterClient(t, c), clusterClient(t, c)
	layout, err := partition.NewLayout(topic, n)
	require.NoError(t, err)
	require.NoError(t, layout.Declare(ctx, pubClient))
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: pubClient}, testLogger())
	require.NoError(t, err)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: subClient, ConsumerGroup: "g", Start: valkeystream.StartHead,
		PartitionOwnerTTL: 2 * time.Second, NackResendDelay: 5 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	e := &env{t: t, topic: topic}
	var h handled
	e.runRouter(sub, func(msg *message.Message) error { h.add(msg); return nil })
	waitUntil(t, "every partition owned", func() bool { return len(owned(sub)) == n })

	published := make(chan struct{})
	go func() {
		defer close(published)
		for seq := range rounds {
			batch := make([]*message.Message, 0, keys)
			for k := range keys {
				batch = append(batch, keyed(fmt.Sprint("key-", k), seq))
			}
			for pub.Publish(topic, batch...) != nil { // during the failover: the same batch again
				time.Sleep(20 * time.Millisecond) // a retry's pause, until the failover is over
			}
			time.Sleep(20 * time.Millisecond) // the time is the scenario: publishing goes on through the failover
		}
	}()
	waitUntil(t, "a third handled", func() bool { return h.count() >= keys*rounds/3 })
	_, replicas, err := c.SlotOwner(ctx, streams[0])
	require.NoError(t, err)
	require.NoError(t, c.Failover(ctx, replicas[0]), "planned failover to %s", replicas[0])
	<-published
	deadline := time.Now().Add(60 * time.Second)
	for h.count() < keys*rounds && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // the poll of a wait for every message
	}
	require.Equal(t, keys*rounds, h.count(), "messages handled")
	h.checkOrder(t, rounds)
	for _, s := range streams {
		waitUntil(t, "nothing pending in "+s, func() bool {
			p, err := subClient.XPending(ctx, s, "g").Result()
			return err == nil && p.Count == 0
		})
	}
}

// TestARebalanceWaitsForASlowHandler moves a partition while its handler
// takes longer than CloseGrace: the new owner handles nothing of it until
// that handling has ended.
func TestARebalanceWaitsForASlowHandler(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	parts := map[string]int{e.topic: 2}
	pub := e.publisher(func(c *valkeystream.PublisherConfig) { c.Partitions = parts })
	newSub := func(name string) *valkeystream.Subscriber {
		return e.subscriber("g", name, fastRedelivery, func(c *valkeystream.SubscriberConfig) {
			c.Partitions = parts
			c.PartitionOwnerTTL = 500 * time.Millisecond
			c.CloseGrace = 100 * time.Millisecond
		})
	}
	var mu sync.Mutex
	busy := map[string]string{} // partition -> subscription handling it
	overlaps := 0
	var slowDone sync.Map // partition -> its first handling was slow
	slowBegan := make(chan struct{}, 2)
	handler := func(name string) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			p := msg.Metadata.Get(valkeystream.MetadataPartition)
			mu.Lock()
			if other, ok := busy[p]; ok && other != name {
				overlaps++
			}
			busy[p] = name
			mu.Unlock()
			if _, done := slowDone.LoadOrStore(p, true); !done {
				slowBegan <- struct{}{}
				time.Sleep(time.Second) // ten CloseGraces, while b joins: whichever partition moves is busy
			}
			mu.Lock()
			delete(busy, p)
			mu.Unlock()
			return nil
		}
	}
	a := newSub("a")
	e.runRouter(a, handler("a"))
	waitUntil(t, "a owns both partitions", func() bool { return len(owned(a)) == 2 })
	for seq := range 20 {
		require.NoError(t, pub.Publish(e.topic, keyed("k-a", seq), keyed("k-b", seq), keyed("k-c", seq)))
	}
	select {
	case <-slowBegan: // the slow handling has begun
	case <-time.After(receiveTimeout):
		t.Fatal("no slow handling began")
	}
	b := newSub("b")
	e.runRouter(b, handler("b"))
	waitUntil(t, "the partitions split 1/1", func() bool { return len(owned(a)) == 1 && len(owned(b)) == 1 })
	waitUntil(t, "everything handled", func() bool {
		n := int64(0)
		for _, s := range mustStreams(t, e.topic, 2) {
			n += e.pendingCount(s, "g")
		}
		return n == 0 && len(busy) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, overlaps, "two subscriptions handled one partition at once")
}

// A user whose ACL predates partitions (no permission on the topic's
// partitions key) still publishes: the check is skipped.
func TestAPublisherWithoutPermissionOnThePartitionsKeyPublishes(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.client.Do(ctx, "ACL", "SETUSER", "old-acl", "on", ">secret", "resetkeys", "~"+e.topic,
		"resetchannels", "-@all", "+xadd", "+get").Err())
	t.Cleanup(func() { _ = e.client.Do(context.Background(), "ACL", "DELUSER", "old-acl").Err() })
	app := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), Username: "old-acl", Password: "secret", DisableIdentity: true})
	t.Cleanup(func() { _ = app.Close() })
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: app}, testLogger())
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, keyed("", 1)))
	n, err := e.client.XLen(ctx, e.topic).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
}
