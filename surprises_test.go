package valkeystream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The group destroyed under a running subscription is created again by the
// group door, at the declared start: StartNew skips what was added while it
// was gone, StartHead replays the whole stream (duplicates, told apart by
// UUID). Entries that were pending are gone with the group.
func TestGroupDestroyedWhileSubscribed(t *testing.T) {
	testserver.Parallel(t)
	for _, start := range []valkeystream.StartPosition{valkeystream.StartNew, valkeystream.StartHead} {
		t.Run(start.String(), func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			logs := newErrorLog(testLogger())
			sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
				Client: e.client, ConsumerGroup: "g", Consumer: "c", Start: start,
				BlockTime: 50 * time.Millisecond,
			}, logs)
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			msgs := e.subscribe(sub)
			first := e.publish(1)
			held := receive(t, msgs)
			require.Equal(t, first[0].UUID, held.UUID)

			require.NoError(t, e.client.XGroupDestroy(ctx, e.topic, "g").Err())
			held.Ack() // its group is gone: nothing to acknowledge any more
			require.Eventually(t, func() bool {
				groups, err := e.client.XInfoGroups(ctx, e.topic).Result()
				return err == nil && len(groups) == 1
			}, receiveTimeout, 10*time.Millisecond, "the door creates the group again")

			later := e.publish(1)
			want := []string{later[0].UUID}
			if start == valkeystream.StartHead {
				want = []string{first[0].UUID, later[0].UUID}
			}
			assert.Equal(t, want, receiveAll(t, msgs, len(want)))
			expectNothing(t, msgs, 200*time.Millisecond)
			assert.NotEmpty(t, logs.lines(), "the vanished group is logged")
			assert.Positive(t, sub.Stats().Faults)
		})
	}
}

// A stream key replaced by a value of another type makes every read fail:
// the subscription logs each failure and backs off (no busy loop), and goes
// on once the key is a stream again.
func TestStreamReplacedByAnotherType(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	logs := newErrorLog(testLogger())
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: e.client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartHead,
		BlockTime: 50 * time.Millisecond,
	}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs := e.subscribe(sub)
	receiveAll(t, msgs, len(e.publish(1)))

	require.NoError(t, e.client.Del(ctx, e.topic).Err())
	require.NoError(t, e.client.Set(ctx, e.topic, "not a stream", 0).Err())
	require.Eventually(t, func() bool { return sub.Stats().Faults >= 3 }, receiveTimeout, 10*time.Millisecond)
	faults := sub.Stats().Faults
	// Backoff doubles from 100 ms: in one second at most about four more
	// tries follow, however fast the server answers.
	time.Sleep(time.Second)
	assert.LessOrEqual(t, sub.Stats().Faults-faults, int64(5), "retries back off")
	// A streak's first failure is logged at Error, the retries at Info.
	wrongType := 0
	for _, line := range append(logs.lines(), logs.infoLines()...) {
		if strings.Contains(line, "WRONGTYPE") {
			wrongType++
		}
	}
	assert.Positive(t, wrongType, "the failure is logged with the server's reply")
	assert.LessOrEqual(t, wrongType, int(sub.Stats().Faults)+1, "one line per failed try, no flood")

	require.NoError(t, e.client.Del(ctx, e.topic).Err())
	// The next try finds no group (NOGROUP), so the door creates the stream
	// and the group again.
	require.Eventually(t, func() bool {
		groups, err := e.client.XInfoGroups(ctx, e.topic).Result()
		return err == nil && len(groups) == 1
	}, 3*backoffCeiling, 10*time.Millisecond)
	later := e.publish(1)
	assert.Equal(t, []string{later[0].UUID}, receiveAll(t, msgs, 1))
}

// backoffCeiling is the longest wait between two tries after failures.
const backoffCeiling = 5 * time.Second

// The server's script cache emptied under a running subscription (SCRIPT
// FLUSH, a restart, a failover) costs nothing: the scripts are sent again on
// their next use. Redis and Valkey word the NOSCRIPT reply differently; only
// its prefix counts.
func TestScriptCacheFlushedWhileSubscribed(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	sub := e.subscriber("g", "c")
	msgs := e.subscribe(sub)
	sent := e.publish(1)
	m := receive(t, msgs)
	require.NoError(t, e.client.ScriptFlush(ctx).Err())
	m.Nack() // claims it back with a script
	again := receive(t, msgs)
	assert.Equal(t, sent[0].UUID, again.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(again))
	again.Ack()
	assert.Zero(t, sub.Stats().Faults)
}
