package valkeystream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// longBlock makes every blocking read wait a minute: far longer than any
// wait a test makes, so that a message that arrives shows the read was
// interrupted, not that it timed out.
func longBlock(c *valkeystream.SubscriberConfig) {
	c.BlockTime = time.Minute
	c.ClaimMinIdle = 2 * time.Minute
}

// clients returns the fields of each connection of the server (CLIENT
// LIST).
func (e *env) clients() []map[string]string {
	e.t.Helper()
	list, err := e.client.ClientList(context.Background()).Result()
	require.NoError(e.t, err)
	var out []map[string]string
	for _, line := range strings.Split(list, "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				f[k] = v
			}
		}
		if len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// connectionsNamed returns how many connections of the server have the
// client name name (redis.Options.ClientName).
func (e *env) connectionsNamed(name string) int {
	n := 0
	for _, c := range e.clients() {
		if c["name"] == name {
			n++
		}
	}
	return n
}

// blockedReads returns how many connections are blocked in XREADGROUP.
func (e *env) blockedReads() int {
	n := 0
	for _, c := range e.clients() {
		if c["cmd"] == "xreadgroup" && strings.Contains(c["flags"], "b") {
			n++
		}
	}
	return n
}

// ackAll acks every message of each channel and counts them by topic,
// until the channels close.
func ackAll(chans map[string]<-chan *message.Message) (counts func() map[string]int, wait func()) {
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for topic, ch := range chans {
		wg.Go(func() {
			for m := range ch {
				m.Ack()
				mu.Lock()
				got[topic]++
				mu.Unlock()
			}
		})
	}
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]int, len(got))
		for k, v := range got {
			out[k] = v
		}
		return out
	}, wg.Wait
}

func TestManyTopicsShareAFewConnections(t *testing.T) {
	testserver.Parallel(t)
	const topics, perTopic, poolSize = 200, 3, 4
	e := newEnv(t)
	// Pipelines on the main pool too (go-redis has a pool of its own for
	// them by default), so that PoolSize bounds the client.
	client := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), PoolSize: poolSize, PipelinePoolSize: -1, ClientName: "many-topics"})
	t.Cleanup(func() { _ = client.Close() })
	sub := e.subscriber("g", "c", onClient(client))

	chans := map[string]<-chan *message.Message{}
	names := make([]string, topics)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", e.topic, i)
		ch, err := sub.Subscribe(context.Background(), names[i])
		require.NoError(t, err)
		chans[names[i]] = ch
	}
	counts, wait := ackAll(chans)
	pub := e.publisher()
	for range perTopic {
		for _, name := range names {
			require.NoError(t, pub.Publish(name, message.NewMessage(watermill.NewUUID(), []byte("x"))))
		}
	}
	most := 0
	waitUntil(t, "every message delivered", func() bool {
		most = max(most, e.connectionsNamed("many-topics"))
		c := counts()
		for _, name := range names {
			if c[name] < perTopic {
				return false
			}
		}
		return true
	})
	// The client's pool, and the shared readers (one per 128 streams), which
	// copy the client's options and so its name.
	assert.LessOrEqual(t, most, poolSize+2, "connections of the Subscriber with %d topics", topics)
	require.NoError(t, sub.Close())
	wait()
	for _, name := range names {
		p, err := e.client.XPending(context.Background(), name, "g").Result()
		require.NoError(t, err)
		assert.Zero(t, p.Count, "entries left pending on %s", name)
	}
}

func TestANewSubscriptionInterruptsTheSharedRead(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c", longBlock)
	first, err := sub.Subscribe(context.Background(), e.topic+"-a")
	require.NoError(t, err)
	waitUntil(t, "the shared read blocks", func() bool { return e.blockedReads() == 1 })

	// The read in flight does not cover this stream: the new subscription
	// must not wait out its minute.
	second, err := sub.Subscribe(context.Background(), e.topic+"-b")
	require.NoError(t, err)
	pub := e.publisher()
	sent := message.NewMessage(watermill.NewUUID(), []byte("b"))
	require.NoError(t, pub.Publish(e.topic+"-b", sent))
	m := receive(t, second) // receiveTimeout is a third of BlockTime
	assert.Equal(t, sent.UUID, m.UUID)
	m.Ack()

	sent = message.NewMessage(watermill.NewUUID(), []byte("a"))
	require.NoError(t, pub.Publish(e.topic+"-a", sent))
	m = receive(t, first)
	assert.Equal(t, sent.UUID, m.UUID)
	m.Ack()
	waitUntil(t, "both subscriptions wait with one read", func() bool {
		return e.blockedReads() == 1
	})
}

func TestEntriesOfAnEndedSubscriptionAreHandedBack(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c", longBlock)
	gone, stay := e.topic+"-gone", e.topic+"-stay"
	ctx, cancel := context.WithCancel(context.Background())
	goneMsgs, err := sub.Subscribe(ctx, gone)
	require.NoError(t, err)
	stayMsgs, err := sub.Subscribe(context.Background(), stay)
	require.NoError(t, err)
	// Make sure the read in flight covers both: a message on each stream
	// comes through it.
	pub := e.publisher()
	for _, topic := range []string{gone, stay} {
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("warm"))))
	}
	receive(t, goneMsgs).Ack()
	receive(t, stayMsgs).Ack()
	waitUntil(t, "the shared read blocks again", func() bool { return e.blockedReads() == 1 })
	time.Sleep(50 * time.Millisecond) // both waits registered: the read covers both

	// The subscription ends while the read in flight still covers its
	// stream; an entry published now is read for it.
	cancel()
	for range goneMsgs {
	}
	sent := message.NewMessage(watermill.NewUUID(), []byte("late"))
	require.NoError(t, pub.Publish(gone, sent))

	waitUntil(t, "the late entry is handed back or was never read", func() bool {
		p, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{
			Stream: gone, Group: "g", Start: "-", End: "+", Count: 10}).Result()
		require.NoError(t, err)
		info, err := e.client.XInfoGroups(context.Background(), gone).Result()
		require.NoError(t, err)
		unread := len(info) == 1 && info[0].Lag > 0
		return unread || (len(p) == 1 && p[0].Idle > 24*time.Hour)
	})

	// A new subscription under the same name drains it.
	again, err := sub.Subscribe(context.Background(), gone)
	require.NoError(t, err)
	m := receive(t, again)
	assert.Equal(t, sent.UUID, m.UUID)
	m.Ack()
}

func TestCloseEndsManyIdleSharedSubscriptionsAtOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c", longBlock)
	var chans []<-chan *message.Message
	for i := range 50 {
		ch, err := sub.Subscribe(context.Background(), fmt.Sprintf("%s-%d", e.topic, i))
		require.NoError(t, err)
		chans = append(chans, ch)
	}
	waitUntil(t, "the shared read blocks", func() bool { return e.blockedReads() == 1 })
	began := time.Now()
	require.NoError(t, sub.Close())
	// A structural bound: Close must not wait out a blocked read.
	assert.Less(t, time.Since(began), 30*time.Second, "Close waited for the shared read to time out")
	for _, ch := range chans {
		_, ok := <-ch
		assert.False(t, ok)
	}
	waitUntil(t, "the shared reader's connection is closed", func() bool { return e.blockedReads() == 0 })
}

func TestSubscriptionsReadOnTheirOwnWithoutClientUnblock(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	// CLIENT ID allowed, CLIENT UNBLOCK not: written so that Redis 6.2,
	// which cannot deny one subcommand (-client|unblock), takes it too.
	sub := limitedSubscriber(t, e, "no-unblock", "-client", "+client|id")
	var chans []<-chan *message.Message
	for i := range 2 {
		ch, err := sub.Subscribe(context.Background(), fmt.Sprintf("%s-%d", e.topic, i))
		require.NoError(t, err)
		chans = append(chans, ch)
	}
	waitUntil(t, "each subscription blocks on its own", func() bool { return e.blockedReads() == 2 })
	pub := e.publisher()
	for i, ch := range chans {
		sent := message.NewMessage(watermill.NewUUID(), []byte("x"))
		require.NoError(t, pub.Publish(fmt.Sprintf("%s-%d", e.topic, i), sent))
		m := receive(t, ch)
		assert.Equal(t, sent.UUID, m.UUID)
		m.Ack()
	}
}
