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

// receiveTimeout bounds every wait for a message that must arrive. It is a
// deadline for a hang, not a speed requirement.
const receiveTimeout = 20 * time.Second

// env is one test's server, client and topic.
type env struct {
	t      *testing.T
	srv    *testserver.Server
	client *redis.Client
	topic  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := testserver.Start(t)
	return &env{t: t, srv: srv, client: newClient(t, srv), topic: "topic-" + watermill.NewShortUUID()}
}

// subscriber returns a consumer-group Subscriber on the env's client, closed
// when the test ends. edit adjusts the config.
func (e *env) subscriber(group, consumer string, edit ...func(*valkeystream.SubscriberConfig)) *valkeystream.Subscriber {
	e.t.Helper()
	cfg := valkeystream.SubscriberConfig{
		Client:        e.client,
		ConsumerGroup: group,
		Consumer:      consumer,
		Start:         valkeystream.StartHead,
	}
	for _, f := range edit {
		f(&cfg)
	}
	sub, err := valkeystream.NewSubscriber(cfg, testLogger())
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func (e *env) subscribe(sub *valkeystream.Subscriber) <-chan *message.Message {
	e.t.Helper()
	msgs, err := sub.Subscribe(context.Background(), e.topic)
	require.NoError(e.t, err)
	return msgs
}

// publish publishes n messages with payloads "0".."n-1" and returns them.
func (e *env) publish(n int) []*message.Message {
	e.t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, testLogger())
	require.NoError(e.t, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
	}
	require.NoError(e.t, pub.Publish(e.topic, msgs...))
	return msgs
}

func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-msgs:
		require.True(t, ok, "channel closed, want a message")
		return m
	case <-time.After(receiveTimeout):
		t.Fatalf("no message within %s", receiveTimeout)
		return nil
	}
}

// receiveAll receives n messages, acking each, and returns their UUIDs.
func receiveAll(t *testing.T, msgs <-chan *message.Message, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		m := receive(t, msgs)
		ids = append(ids, m.UUID)
		m.Ack()
	}
	return ids
}

// expectNothing fails if a message arrives within d.
func expectNothing(t *testing.T, msgs <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if ok {
			t.Fatalf("got message %s (payload %q), want none", m.UUID, m.Payload)
		}
	case <-time.After(d):
	}
}

func (e *env) pending(group string) []redis.XPendingExt {
	e.t.Helper()
	p, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: e.topic, Group: group, Start: "-", End: "+", Count: 1000}).Result()
	require.NoError(e.t, err)
	return p
}

func uuidsOf(msgs []*message.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	return ids
}

func TestGroupDoorRestartStormHasNoErrors(t *testing.T) {
	e := newEnv(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := e.subscriber("storm", fmt.Sprintf("c%d", i))
			_, err := sub.Subscribe(context.Background(), e.topic)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	groups, err := e.client.XInfoGroups(context.Background(), e.topic).Result()
	require.NoError(t, err)
	require.Len(t, groups, 1)
	assert.Equal(t, "storm", groups[0].Name)
}

func TestGroupDoorRefusesWrongType(t *testing.T) {
	e := newEnv(t)
	require.NoError(t, e.client.Set(context.Background(), e.topic, "not a stream", 0).Err())
	sub := e.subscriber("g", "c")

	_, err := sub.Subscribe(context.Background(), e.topic)
	require.Error(t, err)
	var doorErr *valkeystream.GroupCreateError
	require.ErrorAs(t, err, &doorErr)
	assert.Equal(t, e.topic, doorErr.Key)
	assert.Equal(t, "g", doorErr.Group)
	for _, want := range []string{e.topic, `"g"`, "WRONGTYPE"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.ErrorContains(t, sub.SubscribeInitialize(e.topic), "WRONGTYPE")
	// The door never deletes: the key is untouched.
	assert.Equal(t, "not a stream", e.client.Get(context.Background(), e.topic).Val())
}

func TestGroupDoorCreatesStreamBeforeAnyWriter(t *testing.T) {
	e := newEnv(t)
	sub := e.subscriber("g", "c")
	require.NoError(t, sub.SubscribeInitialize(e.topic))
	typ, err := e.client.Type(context.Background(), e.topic).Result()
	require.NoError(t, err)
	assert.Equal(t, "stream", typ)
}

func TestDeclaredStart(t *testing.T) {
	e := newEnv(t)
	old := e.publish(2)

	newSub := e.subscriber("from-new", "c", func(c *valkeystream.SubscriberConfig) { c.Start = valkeystream.StartNew })
	headSub := e.subscriber("from-head", "c")
	newMsgs := e.subscribe(newSub)
	headMsgs := e.subscribe(headSub)
	fresh := e.publish(1)

	assert.Equal(t, uuidsOf(fresh), receiveAll(t, newMsgs, 1), "StartNew must skip entries older than the group")
	expectNothing(t, newMsgs, 200*time.Millisecond)
	assert.Equal(t, append(uuidsOf(old), uuidsOf(fresh)...), receiveAll(t, headMsgs, 3), "StartHead must replay the stream")

	// An existing group keeps its position whatever a later subscriber declares.
	require.NoError(t, newSub.Close())
	again := e.subscriber("from-new", "c") // declares StartHead
	againMsgs := e.subscribe(again)
	expectNothing(t, againMsgs, 300*time.Millisecond)
}

func TestDeliveryMetadata(t *testing.T) {
	e := newEnv(t)
	sent := message.NewMessage(watermill.NewUUID(), []byte("body"))
	sent.Metadata.Set("trace", "abc")
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, sent))

	msgs := e.subscribe(e.subscriber("g", "worker-1"))
	got := receive(t, msgs)
	got.Ack()

	entries, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, sent.UUID, got.UUID, "the UUID is the stored id, not the stream position")
	assert.NotEqual(t, entries[0].ID, got.UUID)
	assert.Equal(t, "body", string(got.Payload))
	assert.Equal(t, "abc", got.Metadata.Get("trace"))
	assert.Equal(t, 1, valkeystream.DeliveryCount(got))
	assert.Equal(t, entries[0].ID, got.Metadata.Get(valkeystream.MetadataEntryID))
	assert.Equal(t, e.topic, got.Metadata.Get(valkeystream.MetadataStream))
	assert.Equal(t, "g", got.Metadata.Get(valkeystream.MetadataGroup))
	assert.Equal(t, "worker-1", got.Metadata.Get(valkeystream.MetadataConsumer))
}

func TestNackRedeliversWithGrowingCountBeforeNewerEntries(t *testing.T) {
	e := newEnv(t)
	sent := e.publish(2)
	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)

	for want := 1; want <= 3; want++ {
		m := receive(t, msgs)
		require.Equal(t, sent[0].UUID, m.UUID, "a nacked message must come back before newer ones")
		require.Equal(t, want, valkeystream.DeliveryCount(m))
		m.Nack()
	}
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)
	assert.Equal(t, 4, valkeystream.DeliveryCount(m))
	p := e.pending("g")
	require.Len(t, p, 2, "both entries are pending while the first is handled")
	assert.Equal(t, int64(4), p[0].RetryCount, "the metadata count is the server's count")
	m.Ack()

	m = receive(t, msgs)
	assert.Equal(t, sent[1].UUID, m.UUID)
	assert.Equal(t, 1, valkeystream.DeliveryCount(m))
	m.Ack()

	require.NoError(t, sub.Close())
	assert.Empty(t, e.pending("g"), "Close must flush every Ack")
	assert.Equal(t, int64(3), sub.Stats().Nacked)
}

func TestNackResendDelay(t *testing.T) {
	e := newEnv(t)
	e.publish(1)
	msgs := e.subscribe(e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.NackResendDelay = 300 * time.Millisecond
	}))
	m := receive(t, msgs)
	nackedAt := time.Now()
	m.Nack()
	again := receive(t, msgs)
	assert.GreaterOrEqual(t, time.Since(nackedAt), 300*time.Millisecond, "a delay is a lower bound")
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()
}

func TestRestartedConsumerGetsItsOwnPendingEntriesFirst(t *testing.T) {
	e := newEnv(t)
	held := e.publish(3)

	first := e.subscriber("g", "worker")
	m := receive(t, e.subscribe(first)) // the loop fetched all three
	require.Equal(t, held[0].UUID, m.UUID)
	require.NoError(t, first.Close()) // no Ack: a crash, as far as the group knows
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

// shortClaim makes a peer reclaim quickly; the shipped ClaimMinIdle of 30 s
// would make this test wait that long.
func shortClaim(c *valkeystream.SubscriberConfig) {
	c.BlockTime = 50 * time.Millisecond
	c.ClaimInterval = 50 * time.Millisecond
	c.ClaimMinIdle = 300 * time.Millisecond
	c.AckFlushInterval = 10 * time.Millisecond
}

func TestPeerReclaimsEntriesOfAConsumerThatNeverReturns(t *testing.T) {
	e := newEnv(t)
	sent := e.publish(3)
	dead := e.subscriber("g", "dead")
	receive(t, e.subscribe(dead))
	require.NoError(t, dead.Close())

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

// collect gathers what a peer receives, acking it, until the test ends.
func collect(t *testing.T, msgs <-chan *message.Message) func() []*message.Message {
	var mu sync.Mutex
	var got []*message.Message
	go func() {
		for m := range msgs {
			mu.Lock()
			got = append(got, m)
			mu.Unlock()
			m.Ack()
		}
	}()
	return func() []*message.Message {
		mu.Lock()
		defer mu.Unlock()
		return append([]*message.Message(nil), got...)
	}
}

// leaseClaim makes a peer reclaim within seconds while leaving a renewal
// (every ClaimMinIdle/3 = 500 ms) a second of slack, so that a loaded machine
// that delays one renewal does not hand a live entry to the peer.
func leaseClaim(c *valkeystream.SubscriberConfig) {
	shortClaim(c)
	c.ClaimMinIdle = 1500 * time.Millisecond
}

func TestLiveHandlerKeepsItsEntryWhilePeersReclaim(t *testing.T) {
	e := newEnv(t)
	e.publish(1)
	holder := e.subscriber("g", "holder", leaseClaim)
	m := receive(t, e.subscribe(holder))
	peer := e.subscriber("g", "peer", leaseClaim)
	peerGot := collect(t, e.subscribe(peer))

	// Handle for twice ClaimMinIdle while the peer's beat runs.
	time.Sleep(2 * 1500 * time.Millisecond)
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "holder", p[0].Consumer, "a live handler's entry must not be reclaimed")
	assert.Equal(t, int64(1), p[0].RetryCount, "renewing the hold must not grow the delivery count")
	m.Ack()
	require.NoError(t, holder.Close())
	assert.Empty(t, peerGot(), "the peer must not receive the entry being handled")
	assert.Empty(t, e.pending("g"))
}

func TestQueuedEntriesAreNotReclaimedWhileTheBatchIsHandled(t *testing.T) {
	e := newEnv(t)
	sent := e.publish(10)
	slow := e.subscriber("g", "slow", leaseClaim)
	msgs := e.subscribe(slow)
	first := receive(t, msgs) // the loop has fetched all ten in one batch
	peerGot := collect(t, e.subscribe(e.subscriber("g", "peer", leaseClaim)))

	const handling = 350 * time.Millisecond // ten of these outlast ClaimMinIdle twice
	got := []string{first.UUID}
	time.Sleep(handling)
	first.Ack()
	for range 9 {
		m := receive(t, msgs)
		assert.Equal(t, 1, valkeystream.DeliveryCount(m), "a queued entry is still on its first delivery")
		got = append(got, m.UUID)
		time.Sleep(handling)
		m.Ack()
	}
	require.NoError(t, slow.Close())
	assert.Equal(t, uuidsOf(sent), got)
	assert.Empty(t, peerGot(), "entries waiting in a batch must not go to a peer")
	assert.Empty(t, e.pending("g"))
}

func TestQueuedEntryTakenOverByAnotherConsumerIsSkipped(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	sent := e.publish(3)
	// Renewals every second. The claim beat runs once at the start and not
	// again within the test, so nothing reclaims the entry from "other".
	var scripts atomic.Int64 // script calls that have returned
	e.client.AddHook(processHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			if isScript(cmd) {
				scripts.Add(1)
			}
			return err
		}
	}))
	msgs := e.subscribe(e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.ClaimMinIdle = 3 * time.Second
		c.ClaimInterval = time.Hour
		c.DelayedPollInterval = -1 // its script calls would pass for renewals
	}))
	m := receive(t, msgs) // the other two wait in the loop's queue
	require.NoError(t, e.client.XClaim(ctx, &redis.XClaimArgs{Stream: e.topic, Group: "g", Consumer: "other",
		Messages: []string{receiveEntryID(t, e, sent[1].UUID)}}).Err())
	// The only scripts the loop runs here are renewals; the second to end
	// after the XCLAIM started after it, and so has seen the new holder.
	renewals := scripts.Load()
	waitUntil(t, "two renewals after the XCLAIM", func() bool { return scripts.Load() >= renewals+2 })
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
	ctx := context.Background()
	e := newEnv(t)
	sent := e.publish(3)
	sub := e.subscriber("g", "c", shortClaim)
	msgs := e.subscribe(sub)
	m := receive(t, msgs)
	require.NoError(t, e.client.XDel(ctx, e.topic, receiveEntryID(t, e, sent[1].UUID)).Err())
	waitUntil(t, "a renewal notices the deleted body", func() bool { return sub.Stats().MissingBodies == 1 })
	m.Ack()
	next := receive(t, msgs)
	assert.Equal(t, sent[2].UUID, next.UUID)
	next.Ack()
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(1), sub.Stats().MissingBodies)
	assert.Empty(t, e.pending("g"))
}

// limitedSubscriber returns a group Subscriber whose client logs in as a
// user with every permission but the ACL rule deny (e.g. "-xgroup").
func limitedSubscriber(t *testing.T, e *env, user, deny string) *valkeystream.Subscriber {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.client.Do(ctx, "ACL", "SETUSER", user, "on", ">secret", "~*", "+@all", deny).Err())
	t.Cleanup(func() { _ = e.client.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	limited := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), Username: user, Password: "secret"})
	t.Cleanup(func() { _ = limited.Close() })
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: limited, ConsumerGroup: "g", Start: valkeystream.StartNew}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func TestSubscribeFailsWhenScriptsAreNotAllowed(t *testing.T) {
	e := newEnv(t)
	sub := limitedSubscriber(t, e, "no-scripts", "-@scripting")

	_, err := sub.Subscribe(context.Background(), e.topic)
	require.Error(t, err, "a subscription that could not Nack must not start")
	assert.ErrorContains(t, err, "NOPERM")
	assert.ErrorContains(t, err, "EVALSHA")
	require.NoError(t, sub.Close())
}

// A script call that fails without a reply from the server (a connection
// lost, say) fails Subscribe with the cause, not with advice about
// permissions.
func TestSubscribeFailsWhenTheScriptCheckGetsNoReply(t *testing.T) {
	e := newEnv(t)
	lost := errors.New("connection lost")
	client := redis.NewClient(&redis.Options{Addr: e.srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(processHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if isScript(cmd) {
				cmd.SetErr(lost)
				return lost
			}
			return next(ctx, cmd)
		}
	}))
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Start: valkeystream.StartNew}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	_, err = sub.Subscribe(context.Background(), e.topic)
	require.ErrorIs(t, err, lost)
	assert.ErrorContains(t, err, "checking the subscription's scripts")
	assert.NotContains(t, err.Error(), "refused", "no reply is not a refusal")
}

func TestNackLeavesAnEntryThatAnotherConsumerTookOver(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.publish(1)
	msgs := e.subscribe(e.subscriber("g", "c"))
	m := receive(t, msgs)
	id := m.Metadata.Get(valkeystream.MetadataEntryID)
	require.NoError(t, e.client.XClaim(ctx, &redis.XClaimArgs{
		Stream: e.topic, Group: "g", Consumer: "other", Messages: []string{id}}).Err())
	m.Nack()
	expectNothing(t, msgs, 500*time.Millisecond)
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "other", p[0].Consumer, "a Nack must not take the entry back from its new holder")
}

func TestAcksAreSentDuringNackResendDelay(t *testing.T) {
	e := newEnv(t)
	sent := e.publish(2)
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.NackResendDelay = 4 * time.Second
		// Long enough that the Ack is still waiting when the Nack comes.
		c.AckFlushInterval = time.Second
	})
	msgs := e.subscribe(sub)
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)
	m.Ack()
	m = receive(t, msgs)
	require.Equal(t, sent[1].UUID, m.UUID)
	m.Nack()
	// Well before the delay ends, the first Ack has reached the server.
	require.Eventually(t, func() bool { return len(e.pending("g")) == 1 }, 3*time.Second, 20*time.Millisecond,
		"an Ack must not wait for another message's NackResendDelay")
	again := receive(t, msgs)
	assert.Equal(t, sent[1].UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()
}

func TestTrimmedPendingEntriesAreAckedNotDelivered(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.publish(3)
	first := e.subscriber("g", "c")
	receive(t, e.subscribe(first))
	require.NoError(t, first.Close())
	require.NoError(t, e.client.XTrimMaxLen(ctx, e.topic, 0).Err())
	fresh := e.publish(1)

	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	got := receive(t, msgs)
	assert.Equal(t, fresh[0].UUID, got.UUID, "only the entry that still exists is delivered")
	got.Ack()
	require.NoError(t, sub.Close())
	assert.Equal(t, int64(3), sub.Stats().MissingBodies)
	assert.Empty(t, e.pending("g"))
}

func TestDeletedEntriesOnReclaimAndNack(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	sent := e.publish(3)
	dead := e.subscriber("g", "dead")
	receive(t, e.subscribe(dead))
	require.NoError(t, dead.Close())
	require.NoError(t, e.client.XDel(ctx, e.topic, receiveEntryID(t, e, sent[1].UUID)).Err())

	peer := e.subscriber("g", "peer", shortClaim)
	msgs := e.subscribe(peer)
	m := receive(t, msgs)
	require.Equal(t, sent[0].UUID, m.UUID)
	// The body of a nacked entry vanishes before it is delivered again.
	require.NoError(t, e.client.XDel(ctx, e.topic, m.Metadata.Get(valkeystream.MetadataEntryID)).Err())
	m.Nack()
	m = receive(t, msgs)
	assert.Equal(t, sent[2].UUID, m.UUID)
	m.Ack()
	require.NoError(t, peer.Close())
	assert.Equal(t, int64(2), peer.Stats().MissingBodies)
	assert.Empty(t, e.pending("g"))
}

// receiveEntryID finds the stream entry id of a published message.
func receiveEntryID(t *testing.T, e *env, uuid string) string {
	t.Helper()
	entries, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	for _, en := range entries {
		if en.Values[valkeystream.FieldUUID] == uuid {
			return en.ID
		}
	}
	t.Fatalf("no entry holds message %s", uuid)
	return ""
}

func TestUndecodableEntryIsMovedAsideAndTheLoopGoesOn(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	badID, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{"foo", "bar"}}).Result()
	require.NoError(t, err)
	good := e.publish(1)

	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	got := receive(t, msgs)
	assert.Equal(t, good[0].UUID, got.UUID)
	got.Ack()
	require.NoError(t, sub.Close())

	moved, err := e.client.XRange(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, moved, 1)
	dead, err := valkeystream.DefaultMarshaler{}.Unmarshal(moved[0].Values)
	require.NoError(t, err, "the dead letter of an undecodable entry is a message")
	assert.Equal(t, "bar", dead.Metadata.Get("foo"), "the raw fields are kept")
	assert.Contains(t, dead.Metadata.Get(valkeystream.MetadataError), `no "uuid" field`)
	assert.Equal(t, badID, dead.Metadata.Get(valkeystream.MetadataOriginalEntryID))
	assert.Equal(t, e.topic, dead.Metadata.Get(valkeystream.MetadataOriginalStream))
	assert.Equal(t, "g", dead.Metadata.Get(valkeystream.MetadataOriginalGroup))
	assert.Empty(t, e.pending("g"), "the undecodable entry is acknowledged once it is copied")
	assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
}

func TestUndecodableEntryStaysPendingWhenItCannotBeMoved(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	require.NoError(t, e.client.Set(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix, "occupied", 0).Err())
	_, err := e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: []any{"foo", "bar"}}).Result()
	require.NoError(t, err)
	good := e.publish(1)

	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	got := receive(t, msgs)
	assert.Equal(t, good[0].UUID, got.UUID, "one bad entry never stops the loop")
	got.Ack()
	require.NoError(t, sub.Close())
	p := e.pending("g")
	require.Len(t, p, 1, "an entry that could not be moved aside is never lost")
	assert.Equal(t, int64(0), sub.Stats().InvalidEntries)
}

func TestGroupRecreatedWhenItVanishes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	// A short BlockTime makes the loop notice the deleted stream sooner; the
	// default works too, only slower.
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.BlockTime = 50 * time.Millisecond })
	msgs := e.subscribe(sub)
	first := e.publish(1)
	assert.Equal(t, uuidsOf(first), receiveAll(t, msgs, 1))

	require.NoError(t, e.client.Del(ctx, e.topic).Err())
	later := e.publish(1)
	assert.Equal(t, uuidsOf(later), receiveAll(t, msgs, 1), "the door runs again and the group (StartHead) replays the new stream")
	groups, err := e.client.XInfoGroups(ctx, e.topic).Result()
	require.NoError(t, err)
	require.Len(t, groups, 1)
}

func TestFanOutDeliversEveryEntryToEverySubscriber(t *testing.T) {
	e := newEnv(t)
	newSub := func(start valkeystream.StartPosition) <-chan *message.Message {
		sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: e.client, Start: start}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return e.subscribe(sub)
	}
	old := e.publish(1)
	a, b := newSub(valkeystream.StartNew), newSub(valkeystream.StartNew)
	head := newSub(valkeystream.StartHead)
	fresh := e.publish(3)

	assert.Equal(t, uuidsOf(fresh), receiveAll(t, a, 3))
	assert.Equal(t, uuidsOf(fresh), receiveAll(t, b, 3))
	assert.Equal(t, append(uuidsOf(old), uuidsOf(fresh)...), receiveAll(t, head, 4))

	// A Nack in fan-out delivers the same message again.
	more := e.publish(1)
	m := receive(t, a)
	require.Equal(t, more[0].UUID, m.UUID)
	m.Nack()
	again := receive(t, a)
	assert.Equal(t, more[0].UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()

	// Group and consumer are empty in fan-out, whatever the publisher wrote
	// under those keys (a message passed on by a poison queue, say).
	passedOn := message.NewMessage(watermill.NewUUID(), []byte("x"))
	passedOn.Metadata.Set(valkeystream.MetadataGroup, "orders")
	passedOn.Metadata.Set(valkeystream.MetadataConsumer, "host-a")
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(e.topic, passedOn))
	got := receive(t, b)
	require.Equal(t, more[0].UUID, got.UUID, "b has not read this one yet")
	got.Ack()
	got = receive(t, b)
	require.Equal(t, passedOn.UUID, got.UUID)
	assert.Empty(t, got.Metadata.Get(valkeystream.MetadataGroup))
	assert.Empty(t, got.Metadata.Get(valkeystream.MetadataConsumer))
	got.Ack()

	_, err = e.client.XInfoGroups(context.Background(), e.topic).Result()
	assert.NoError(t, err)
	assert.Empty(t, e.client.XInfoGroups(context.Background(), e.topic).Val(), "fan-out creates no group")
}

func TestSubscribeContextEndsOnlyThatSubscription(t *testing.T) {
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

func TestMessageContextEndsWhenSettled(t *testing.T) {
	e := newEnv(t)
	e.publish(1)
	m := receive(t, e.subscribe(e.subscriber("g", "c")))
	require.NoError(t, m.Context().Err())
	m.Ack()
	select {
	case <-m.Context().Done():
	case <-time.After(receiveTimeout):
		t.Fatal("the message context was not cancelled after Ack")
	}
}

func TestCloseFlushesAcksAndLeavesTheRestPending(t *testing.T) {
	e := newEnv(t)
	sent := e.publish(2)
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
		c.AckFlushInterval = time.Minute // only Close sends it
		c.ClaimMinIdle = 2 * time.Minute
	})
	msgs := e.subscribe(sub)
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
				assert.True(t, errors.Is(err, valkeystream.ErrSubscriberClosed) || errors.Is(err, context.Canceled),
					"unexpected error: %v", err)
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
		time.Sleep(10 * time.Millisecond)
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
	e := newEnv(t)
	host, err := os.Hostname()
	require.NoError(t, err)
	e.publish(1)
	m := receive(t, e.subscribe(e.subscriber("g", "")))
	assert.Equal(t, host, m.Metadata.Get(valkeystream.MetadataConsumer))
	m.Ack()
}

func TestAckJustBeforeCloseIsSent(t *testing.T) {
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

func TestGroupDoorRefusesWithoutPermission(t *testing.T) {
	e := newEnv(t)
	sub := limitedSubscriber(t, e, "no-xgroup", "-xgroup")

	_, err := sub.Subscribe(context.Background(), e.topic)
	var doorErr *valkeystream.GroupCreateError
	require.ErrorAs(t, err, &doorErr)
	assert.ErrorContains(t, err, "NOPERM")
	assert.ErrorContains(t, err, e.topic)
	require.NoError(t, sub.Close())
}

// processHook is a redis.Hook that wraps single commands and lets dials and
// pipelines through.
type processHook func(next redis.ProcessHook) redis.ProcessHook

func (h processHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h processHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return h(next) }
func (h processHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isScript reports whether cmd runs a server-side script (EVALSHA, EVAL).
func isScript(cmd redis.Cmder) bool {
	return cmd.Name() == "evalsha" || cmd.Name() == "eval"
}

// sloppyUnmarshaler returns neither a message nor an error for entries whose
// uuid is "nothing", and messages without a metadata map for the others.
type sloppyUnmarshaler struct{}

func (sloppyUnmarshaler) Unmarshal(fields map[string]any) (*message.Message, error) {
	if fields[valkeystream.FieldUUID] == "nothing" {
		return nil, nil
	}
	msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(fields)
	if msg != nil {
		msg.Metadata = nil
	}
	return msg, err
}

// A faulty Unmarshaler does not crash the subscription: an entry it returns
// nothing for is undecodable (dead-lettered with a group), and a message
// without a metadata map still gets the delivery metadata.
func TestFaultyUnmarshalerDoesNotCrashTheSubscription(t *testing.T) {
	ctx := context.Background()
	for _, group := range []string{"g", ""} {
		t.Run("group="+group, func(t *testing.T) {
			e := newEnv(t)
			require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: e.topic,
				Values: []any{valkeystream.FieldUUID, "nothing", valkeystream.FieldPayload, ""}}).Err())
			sent := e.publish(1)
			sub := e.subscriber(group, "c", func(c *valkeystream.SubscriberConfig) { c.Unmarshaler = sloppyUnmarshaler{} })
			got := receive(t, e.subscribe(sub))
			assert.Equal(t, sent[0].UUID, got.UUID)
			assert.Equal(t, 1, valkeystream.DeliveryCount(got))
			assert.Equal(t, e.topic, got.Metadata.Get(valkeystream.MetadataStream))
			got.Ack()
			require.NoError(t, sub.Close())
			assert.Equal(t, int64(1), sub.Stats().InvalidEntries)
			if group != "" {
				assert.Equal(t, int64(1), e.client.XLen(ctx, e.topic+valkeystream.DefaultDeadLetterSuffix).Val(),
					"the entry is dead-lettered")
				assert.Empty(t, e.pending(group))
			}
		})
	}
}
