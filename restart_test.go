package valkeystream_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/testserver"
)

// A process killed with SIGKILL while it holds entries, started again under
// the same Consumer (the default ConsumerLeaseTTL, 10 s): the restarted
// process handles new messages while its dead predecessor's lease is still
// on the server, and the predecessor's entries once that lease has lapsed,
// each once, delivered a second time; nothing stays pending. No peer could
// have reclaimed them: ClaimMinIdle is a minute. The figures are logged.
func TestKilledProcessRestartedUnderItsNameHandlesNewMessagesAtOnce(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	bin := buildCrashWorker(t)
	opts := []string{"-claim-min-idle", "1m", "-claim-interval", "1m", "-batch", "10",
		"-prefetch", valkeystream.FullBatches.String(), "-read-ahead-bytes", "-1"}
	key := leaseKeyOf(e.topic, "g", "worker")
	old := uuidsOf(e.publish(5))
	first, _ := startWorker(t, e, bin, "worker", append([]string{"-stall"}, opts...)...)
	require.Eventually(t, func() bool {
		p, err := e.client.XPending(ctx, e.topic, "g").Result()
		return err == nil && p.Count == 5 && p.Consumers["worker"] == 5
	}, time.Minute, 20*time.Millisecond, "the stalled worker must hold all five entries")
	require.Equal(t, first.Process.Pid, holderPid(e, key))
	require.NoError(t, first.Process.Kill())
	// A read the killed process left blocked on the server would take a new
	// message for the dead name until the server sees its connection close.
	require.Eventually(t, func() bool { return blockedClients(t, e) == 0 }, receiveTimeout, 5*time.Millisecond,
		"the server must see the killed process's connections close")

	restarted := time.Now()
	_, ledger := startWorker(t, e, bin, "worker", opts...)
	fresh := uuidsOf(e.publish(3))
	isOld := map[string]bool{}
	for _, id := range old {
		isOld[id] = true
	}
	handled := map[string][]int{} // uuid -> the delivery count of each handling
	var firstNew, allOld time.Duration
	heldAtFirstNew, heldAtFirstOld := -1, -1 // pid holding the bare name's lease then
	require.Eventually(t, func() bool {
		recs, err := ledger.Read()
		require.NoError(t, err)
		for _, r := range recs {
			if r.Kind != audit.Handled {
				continue
			}
			handled[r.UUID] = append(handled[r.UUID], r.Count)
			switch {
			case !isOld[r.UUID] && heldAtFirstNew < 0:
				firstNew, heldAtFirstNew = time.Since(restarted), holderPid(e, key)
			case isOld[r.UUID] && heldAtFirstOld < 0:
				heldAtFirstOld = holderPid(e, key)
			}
		}
		for _, id := range append(old, fresh...) {
			if len(handled[id]) == 0 {
				return false
			}
		}
		allOld = time.Since(restarted)
		return true
	}, time.Minute, 10*time.Millisecond, "the restarted worker must handle the new messages and its predecessor's")
	// allOld is when the last message of all was seen; the predecessor's
	// are the last to come.
	t.Logf("restart under the same name after SIGKILL (ConsumerLeaseTTL %s, process start included): first new message handled after %s, the predecessor's %d entries after %s",
		valkeystream.DefaultConsumerLeaseTTL, firstNew.Round(time.Millisecond), len(old), allOld.Round(time.Millisecond))

	assert.Equal(t, first.Process.Pid, heldAtFirstNew,
		"a new message must be handled while the dead predecessor's lease is still on the server, not after it lapsed")
	assert.NotEqual(t, first.Process.Pid, heldAtFirstOld,
		"the predecessor's entries are taken only once its lease has lapsed")
	for _, id := range old {
		assert.Equal(t, []int{2}, handled[id], "message %s of the predecessor: handled once, delivered a second time", id)
	}
	for _, id := range fresh {
		assert.Equal(t, []int{1}, handled[id], "new message %s: handled once", id)
	}
	require.Eventually(t, func() bool {
		p, err := e.client.XPending(ctx, e.topic, "g").Result()
		return err == nil && p.Count == 0
	}, receiveTimeout, 20*time.Millisecond, "nothing may stay pending")
}

// blockedClients returns the server's count of clients blocked in a read.
func blockedClients(t *testing.T, e *env) int {
	t.Helper()
	info, err := e.client.Info(context.Background(), "clients").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("INFO clients has no blocked_clients:\n%s", info)
	return 0
}

// A pod restarted under a fresh name (a Deployment's pods get one each
// time) after a crash, simulated by a consumer that read entries and a lease
// nobody renews: nothing of the departed name is taken over through its
// lease (another base), its entries are reclaimed once idle past
// ClaimMinIdle, each handled once, and the departed consumer is removed
// once it holds nothing and is idle past RemoveIdleConsumersAfter. The
// figures are logged, with the timings scaled down.
func TestCrashedPodWithAFreshNameLeavesNothingBehind(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	const (
		minIdle = time.Second
		age     = 2 * time.Second
	)
	require.NoError(t, e.client.XGroupCreateMkStream(ctx, e.topic, "g", "0").Err())
	old := uuidsOf(e.publish(3))
	require.NoError(t, e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "g", Consumer: "pod-a", Streams: []string{e.topic, ">"}, Count: 3, Block: -1}).Err())
	require.NoError(t, e.client.Set(ctx, leaseKeyOf(e.topic, "g", "pod-a"), "a-killed-process", time.Second).Err())
	crashed := time.Now()

	sub := e.subscriber("g", "pod-b", func(c *valkeystream.SubscriberConfig) {
		c.ClaimMinIdle = minIdle
		c.ClaimInterval = 200 * time.Millisecond
		c.BlockTime = 100 * time.Millisecond
		c.RemoveIdleConsumersAfter = age
		c.ConsumerLeaseTTL = time.Second
	})
	msgs := e.subscribe(sub)
	counts := map[string][]int{}
	for range old {
		m := receive(t, msgs)
		counts[m.UUID] = append(counts[m.UUID], valkeystream.DeliveryCount(m))
		m.Ack()
	}
	reclaimed := time.Since(crashed)
	for _, id := range old {
		assert.Equal(t, []int{2}, counts[id], "entry %s of the departed pod: reclaimed and handled once", id)
	}
	assert.GreaterOrEqual(t, reclaimed, minIdle, "reclaimed only once idle past ClaimMinIdle")
	require.Eventually(t, func() bool {
		cs, err := e.client.XInfoConsumers(ctx, e.topic, "g").Result()
		require.NoError(t, err)
		return len(cs) == 1 && cs[0].Name == "pod-b"
	}, receiveTimeout, 20*time.Millisecond, "the departed consumer must be removed")
	removed := time.Since(crashed)
	// The last Ack may still be batched when the consumer goes.
	require.Eventually(t, func() bool { return e.pendingCount(e.topic, "g") == 0 },
		receiveTimeout, 20*time.Millisecond, "the reclaimed entries must be acknowledged")
	t.Logf("crashed pod under a fresh name (ClaimMinIdle %s, ClaimInterval 200ms, RemoveIdleConsumersAfter %s): its entries handled %s after its last read, its consumer removed after %s",
		minIdle, age, reclaimed.Round(time.Millisecond), removed.Round(time.Millisecond))
}
