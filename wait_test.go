package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// streamUUIDs returns the UUIDs of every entry of key on the server at addr.
func streamUUIDs(t *testing.T, addr, key string) map[string]bool {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	entries, err := c.XRange(context.Background(), key, "-", "+").Result()
	require.NoError(t, err, "XRANGE %s on %s", key, addr)
	ids := make(map[string]bool, len(entries))
	for _, e := range entries {
		ids[e.Values[valkeystream.FieldUUID].(string)] = true
	}
	return ids
}

// requireNotReplicated checks that err says msgs were not acknowledged by
// enough replicas.
func requireNotReplicated(t *testing.T, err error, msgs []*message.Message) {
	t.Helper()
	require.ErrorIs(t, err, valkeystream.ErrNotReplicated)
	var pe *valkeystream.PublishError
	require.ErrorAs(t, err, &pe)
	want := make([]string, len(msgs))
	for i, m := range msgs {
		want[i] = m.UUID
	}
	require.Equal(t, want, pe.NotSent, "UUIDs named by the error")
}

// testFrozenReplica publishes through pub (WaitReplicas 1) while the only
// replica of key's master is frozen: single and concurrent calls (which
// share round trips, and so WAIT) fail with ErrNotReplicated after the
// timeout, the entries are on the master nonetheless, and publishing works
// again once the replica is back.
func testFrozenReplica(t *testing.T, pub *valkeystream.Publisher, topic, master string, replica *testserver.Server, timeout time.Duration) {
	require.NoError(t, pub.Publish(topic, newMessages(1)...), "Publish with a healthy replica")
	require.NoError(t, replica.Freeze())
	thawed := false
	defer func() {
		if !thawed {
			_ = replica.Thaw()
		}
	}()

	msgs := newMessages(3)
	start := time.Now()
	err := pub.Publish(topic, msgs...)
	took := time.Since(start)
	requireNotReplicated(t, err, msgs)
	require.GreaterOrEqual(t, took, timeout, "Publish returned before WaitTimeout")

	const calls = 16
	errs := make([]error, calls)
	batches := make([][]*message.Message, calls)
	var wg sync.WaitGroup
	for i := range calls {
		batches[i] = newMessages(1 + i%3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pub.Publish(topic, batches[i]...)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		requireNotReplicated(t, err, batches[i])
	}

	onMaster := streamUUIDs(t, master, topic)
	for _, m := range msgs {
		require.True(t, onMaster[m.UUID], "entry %s not on the master: a WAIT failure must not hide a write", m.UUID)
	}

	require.NoError(t, replica.Thaw())
	thawed = true
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := pub.Publish(topic, newMessages(1)...)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, valkeystream.ErrNotReplicated)
		require.True(t, time.Now().Before(deadline), "Publish still fails 30 s after the replica is back: %v", err)
	}
}

// TestWaitReplicasSentinel: with the replica frozen, Publish with
// WaitReplicas 1 fails with ErrNotReplicated; and a planned Sentinel
// failover under load loses no message whose Publish returned nil (the
// writes that reach the demoted master find no replica and fail).
func TestWaitReplicasSentinel(t *testing.T) {
	testserver.Parallel(t)
	g := testserver.StartSentinel(t)
	addrs := g.DataAddrs()

	t.Run("frozen replica", func(t *testing.T) {
		const timeout = 300 * time.Millisecond
		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
			Client: sentinelClient(t, g), WaitReplicas: 1, WaitTimeout: timeout,
		}, testLogger())
		require.NoError(t, err)
		defer pub.Close()
		testFrozenReplica(t, pub, "wait-frozen", addrs[0], g.Node(addrs[1]), timeout)
	})

	t.Run("planned failover", func(t *testing.T) {
		const topic = "wait-failover"
		lost, run := plannedFailover(t, g, topic, 1)
		if len(lost) > 0 {
			t.Errorf("%d messages whose Publish returned nil are missing from the new master, e.g. %s", len(lost), lost[0])
		}
		t.Logf("planned failover with WaitReplicas 1: %s", run)
	})

	// The same failover without WaitReplicas loses the writes that reach
	// the old master after the promotion; it only measures that, so it runs
	// on request.
	t.Run("planned failover without WaitReplicas", func(t *testing.T) {
		if os.Getenv("VALKEYSTREAM_HA_CONTROL") == "" {
			t.Skip("set VALKEYSTREAM_HA_CONTROL=1 to measure what a planned failover loses without WaitReplicas")
		}
		require.NoError(t, g.WaitReplicaInSync(context.Background(), addrs[0]))
		_, run := plannedFailover(t, g, "wait-failover-control", 0)
		t.Logf("planned failover without WaitReplicas: %s", run)
	})
}

// TestWaitReplicasCluster: on a cluster, WAIT goes to the master of the
// topic's slot with the XADDs; with that master's replica frozen, Publish
// fails with ErrNotReplicated, while a topic on another master is
// unaffected.
func TestWaitReplicasCluster(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	ctx := context.Background()
	const timeout = 300 * time.Millisecond
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: clusterClient(t, c), WaitReplicas: 1, WaitTimeout: timeout,
	}, testLogger())
	require.NoError(t, err)
	defer pub.Close()

	const topic = "wait-cluster"
	master, replicas, err := c.SlotOwner(ctx, topic)
	require.NoError(t, err)
	require.Len(t, replicas, 1)
	other := ""
	for _, candidate := range []string{"wait-a", "wait-b", "wait-c", "wait-d", "wait-e", "wait-f"} {
		if m, _, err := c.SlotOwner(ctx, candidate); err == nil && m != master {
			other = candidate
			break
		}
	}
	require.NotEmpty(t, other, "no topic on another master")
	require.NoError(t, pub.Publish(other, newMessages(5)...), "Publish to %s", other)

	testFrozenReplica(t, pub, topic, master, c.Node(replicas[0]), timeout)

	require.NoError(t, c.Node(replicas[0]).Freeze())
	defer func() { _ = c.Node(replicas[0]).Thaw() }()
	require.NoError(t, pub.Publish(other, newMessages(5)...), "Publish to %s on another master while %s is frozen", other, replicas[0])
}

// plannedFailover publishes to topic from eight goroutines, one message per
// call, through a Publisher with waitReplicas, asks the sentinels for a
// failover once messages flow, keeps publishing until 200 more messages got
// through after the new master was named, and returns the UUIDs whose
// Publish returned nil but that the new master's stream lacks.
func plannedFailover(t *testing.T, g *testserver.Sentinel, topic string, waitReplicas int) (lost []string, summary string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: sentinelClient(t, g), WaitReplicas: waitReplicas, WaitTimeout: 500 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	defer pub.Close()

	var (
		mu        sync.Mutex
		published []string
		failed    int
		notRepl   int
		cond      = sync.NewCond(&mu)
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte("w"))
				err := pub.Publish(topic, msg)
				mu.Lock()
				switch {
				case err == nil:
					published = append(published, msg.UUID)
				case errors.Is(err, valkeystream.ErrNotReplicated):
					notRepl++
					failed++
				default:
					failed++
				}
				cond.Broadcast()
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // a failed publisher's pause before it tries again
				}
			}
		}()
	}
	waitPublished := func(n int) {
		mu.Lock()
		defer mu.Unlock()
		for len(published) < n {
			if ctx.Err() != nil {
				t.Fatalf("only %d messages published, want %d (%d failed)", len(published), n, failed)
			}
			cond.Wait()
		}
	}
	waitPublished(300)
	asked := time.Now()
	old, err := g.Failover(ctx)
	require.NoError(t, err)
	var newMaster string
	for _, a := range g.DataAddrs() {
		if a != old {
			newMaster = a
		}
	}
	require.NoError(t, g.WaitMaster(ctx, newMaster))
	named := time.Now()
	mu.Lock()
	before, failedBefore := len(published), failed
	mu.Unlock()
	waitPublished(before + 200)
	mu.Lock()
	failedAfter := failed - failedBefore
	mu.Unlock()
	resumed := time.Now()
	close(stop)
	wg.Wait()

	onMaster := streamUUIDs(t, newMaster, topic)
	for _, id := range published {
		if !onMaster[id] {
			lost = append(lost, id)
		}
	}
	summary = fmt.Sprintf("%d published, %d failed (%d not replicated; %d after every sentinel named the new master), %d missing from the new master %s; "+
		"the sentinels named it %s after the request, 200 more messages took %s",
		len(published), failed, notRepl, failedAfter, len(lost), newMaster,
		named.Sub(asked).Round(time.Millisecond), resumed.Sub(named).Round(time.Millisecond))
	return lost, summary
}

// waitHook records the commands of each pipeline that carries XADDs.
type waitHook struct {
	mu        sync.Mutex
	pipelines []string
}

func (h *waitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := ""
		for _, c := range cmds {
			names += c.Name() + " "
		}
		if strings.HasPrefix(names, "xadd") { // not a connection handshake
			h.mu.Lock()
			h.pipelines = append(h.pipelines, names)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// TestWaitReplicasWithoutReplicas: a server without replicas acknowledges
// nothing, so every Publish with WaitReplicas fails with ErrNotReplicated
// after WaitTimeout, names its messages, and leaves them written; WAIT
// follows the XADDs in the same round trip, one-message calls included.
func TestWaitReplicasWithoutReplicas(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	hook := &waitHook{}
	e.client.AddHook(hook)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: e.client, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond,
	}, nil)
	require.NoError(t, err)

	one := newMessages(1)
	requireNotReplicated(t, pub.Publish(e.topic, one...), one)
	two := newMessages(2)
	requireNotReplicated(t, pub.Publish(e.topic, two...), two)
	require.Equal(t, []string{"xadd wait ", "xadd xadd wait "}, hook.pipelines)

	n, err := e.client.XLen(context.Background(), e.topic).Result()
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "entries written although not replicated")

	// WaitReplicas 0 sends no WAIT.
	plain, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, nil)
	require.NoError(t, err)
	require.NoError(t, plain.Publish(e.topic, newMessages(2)...))
	require.Equal(t, "xadd xadd ", hook.pipelines[2])
}
