package sharedread

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestAnInterruptDuringAWritePauseLeavesTheServerUp interrupts the shared
// read while CLIENT PAUSE WRITE holds writes back, as FAILOVER and a SHUTDOWN
// that waits for its replicas do: the first interrupt ends the read, the
// reader sends the next one (which the server postpones), and a second
// subscription asks for another interrupt. A bare CLIENT UNBLOCK of the
// postponed read crashes Redis 7.0 and Valkey 8.0 and older; the
// server must stay up (the same process: testserver would restart a crashed
// one), and every entry must come through once the pause ends.
func TestAnInterruptDuringAWritePauseLeavesTheServerUp(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })

	prefix := "pause-" + watermill.NewShortUUID()
	keys := []string{prefix + "-a", prefix + "-b", prefix + "-c"}
	for _, k := range keys {
		require.NoError(t, admin.XGroupCreateMkStream(ctx, k, "g", "$").Err())
	}
	runID := func() string {
		info, err := admin.Info(ctx, "server").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "run_id:"); ok {
				return v
			}
		}
		t.Fatal("INFO server has no run_id")
		return ""
	}
	before := runID()

	// The block is long enough that a read which was never interrupted
	// would still be waiting when the test looks, and short enough that a
	// failed interrupt costs the test a few seconds, not a failure.
	reg := newTestRegistry(client, 3*time.Second, watermill.NopLogger{})
	waitCtx, stopWaits := context.WithCancel(ctx)
	got := make(chan string, 10)
	wait := func(key string) {
		m := reg.Join(ctx, "c", key)
		require.NotNil(t, m, "no shared reader for %s", key)
		reg.spawn(func() {
			defer m.Leave()
			for waitCtx.Err() == nil {
				w, err := m.Wait(waitCtx, 10, -1)
				if err != nil {
					continue // the loop would read on its own; here it waits again
				}
				for _, e := range w.Entries {
					got <- key + " " + e.Fields["n"].(string)
				}
			}
		})
	}
	blocked := func() bool {
		list, err := admin.ClientList(ctx).Result()
		require.NoError(t, err)
		return strings.Contains(list, "cmd=xreadgroup")
	}

	wait(keys[0])
	require.Eventually(t, blocked, 10*time.Second, 10*time.Millisecond, "the shared read never reached the server")
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", 1500, "WRITE").Err())
	paused := time.Now()
	wait(keys[1])                      // the read in flight does not cover it: the first interrupt
	time.Sleep(200 * time.Millisecond) // the next read, if the interrupt went through, is postponed
	wait(keys[2])                      // another interrupt, of a postponed read if the first went through
	// The time is the scenario: until the pause is over.
	time.Sleep(time.Until(paused.Add(1500 * time.Millisecond)))

	assert.Equal(t, before, runID(), "the server restarted during the pause: an interrupt crashed it")
	for i, k := range keys {
		require.NoError(t, admin.XAdd(ctx, &redis.XAddArgs{Stream: k, Values: []any{"n", i}}).Err())
	}
	var seen []string
	for range keys {
		select {
		case s := <-got:
			seen = append(seen, s)
		case <-time.After(20 * time.Second): // a bound against a hang: BlockTime is 3 s
			t.Fatalf("entries delivered after the pause: %v, want one of each of %v", seen, keys)
		}
	}
	assert.ElementsMatch(t, []string{keys[0] + " 0", keys[1] + " 1", keys[2] + " 2"}, seen)
	stopWaits()
	reg.goroutines.Wait()
}
