package valkeystream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// readAndAck reads every new entry of the env's topic as consumer c of
// group and acknowledges them, returning how many.
func readAndAck(t *testing.T, e *env, group string) int {
	t.Helper()
	ctx := context.Background()
	streams, err := e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: "c", Streams: []string{e.topic, ">"}, Count: 100000, Block: -1,
	}).Result()
	require.NoError(t, err)
	var ids []string
	for _, s := range streams {
		for _, m := range s.Messages {
			ids = append(ids, m.ID)
		}
	}
	require.NoError(t, e.client.XAck(ctx, e.topic, group, ids...).Err())
	return len(ids)
}

const (
	retentionBacklog = 300
	retentionMaxLen  = 10
)

// publishBacklog publishes retentionBacklog messages to the env's topic,
// one call each, and returns their UUIDs.
func publishBacklog(t *testing.T, e *env, pub *valkeystream.Publisher) []string {
	t.Helper()
	msgs := newMessages(retentionBacklog)
	for _, m := range msgs {
		require.NoError(t, pub.Publish(e.topic, m))
	}
	return uuidsOf(msgs)
}

// Where the server trims with ACKED, Retention keeps a backlog no group has
// read (or acknowledged), and trims it once acknowledged.
func TestRetentionKeepsUnacknowledgedEntries(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	if !verbsOf(t, e.client).AckedTrim {
		t.Skipf("%s %s has no working XADD ... ACKED (Redis 8.2.7, 8.4.4, 8.6 and later): Retention trims as before there",
			e.srv.Name(), e.srv.Version())
	}
	require.NoError(t, e.client.XGroupCreateMkStream(ctx, e.topic, "g", "$").Err())
	logs := newErrorLog(testLogger())
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client,
		Retention: map[string]valkeystream.Retention{e.topic: {MaxLen: retentionMaxLen}}}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	unread := publishBacklog(t, e, pub)
	stored := storedCount(t, e.client, e.topic)
	for _, id := range unread {
		require.Equal(t, 1, stored[id], "unread entry %s was trimmed", id)
	}
	// Read but not acknowledged: pending entries stay too.
	_, err = e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "g", Consumer: "c", Streams: []string{e.topic, ">"}, Count: 100000, Block: -1}).Result()
	require.NoError(t, err)
	publishBacklog(t, e, pub) // unread again
	assert.EqualValues(t, 2*retentionBacklog, e.client.XLen(ctx, e.topic).Val(), "pending and unread entries must stay")

	// A call carrying a delayed message writes the ones due now by script,
	// trimmed the same way.
	later := newMessages(2)
	delay.Message(later[0], delay.For(time.Hour))
	require.NoError(t, pub.Publish(e.topic, later...))
	assert.EqualValues(t, 2*retentionBacklog+1, e.client.XLen(ctx, e.topic).Val(), "the delayed path must keep them too")

	// Acknowledge everything: the pending entries, then the unread ones.
	ids, err := e.client.XRange(ctx, e.topic, "-", "+").Result()
	require.NoError(t, err)
	all := make([]string, len(ids))
	for i, m := range ids {
		all[i] = m.ID
	}
	require.Equal(t, retentionBacklog+1, readAndAck(t, e, "g"))
	require.NoError(t, e.client.XAck(ctx, e.topic, "g", all...).Err())
	fresh := publishBacklog(t, e, pub)
	stored = storedCount(t, e.client, e.topic)
	for _, id := range fresh {
		require.Equal(t, 1, stored[id], "unread entry %s was trimmed", id)
	}
	assert.Less(t, e.client.XLen(ctx, e.topic).Val(), int64(2*retentionBacklog),
		"acknowledged entries must be trimmed")
	assert.Contains(t, pub.Stats().Verbs, "acked-trim")
	for _, l := range logs.infoLines() {
		assert.NotContains(t, l, "whether or not consumer groups acknowledged", "no warning where entries are kept")
	}
}

// DropUnacknowledged, and BaselineVerbs, trim as servers without ACKED do:
// an unread backlog is trimmed. Unless DropUnacknowledged says it is meant,
// the Publisher logs once per topic that trimming may drop unacknowledged
// entries.
func TestRetentionDropsUnacknowledgedEntriesWhenTold(t *testing.T) {
	for _, tc := range []struct {
		name     string
		drop     bool
		baseline bool
	}{
		{"DropUnacknowledged", true, false},
		{"BaselineVerbs", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testserver.Parallel(t)
			ctx := context.Background()
			e := newEnv(t)
			require.NoError(t, e.client.XGroupCreateMkStream(ctx, e.topic, "g", "$").Err())
			logs := newErrorLog(testLogger())
			pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
				Client: e.client, BaselineVerbs: tc.baseline,
				Retention: map[string]valkeystream.Retention{
					e.topic: {MaxLen: retentionMaxLen, DropUnacknowledged: tc.drop},
					"other": {MaxLen: retentionMaxLen, DropUnacknowledged: tc.drop},
				}}, logs)
			require.NoError(t, err)
			t.Cleanup(func() { _ = pub.Close() })
			publishBacklog(t, e, pub)
			require.NoError(t, pub.Publish("other", newMessages(2)...))
			assert.Less(t, e.client.XLen(ctx, e.topic).Val(), int64(retentionBacklog), "an unread backlog must be trimmed")
			warnings := 0
			for _, l := range logs.infoLines() {
				if strings.Contains(l, "whether or not consumer groups acknowledged") {
					warnings++
				}
			}
			if tc.drop {
				assert.Zero(t, warnings, "DropUnacknowledged says it is meant: no warning")
			} else {
				assert.Equal(t, 2, warnings, "one warning per topic")
			}
		})
	}
}

// On a server without working ACKED trimming, Retention trims as before
// and says so once per topic.
func TestRetentionOnAServerWithoutAckedTrim(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	if verbsOf(t, e.client).AckedTrim {
		t.Skipf("%s %s trims with ACKED: TestRetentionKeepsUnacknowledgedEntries covers it", e.srv.Name(), e.srv.Version())
	}
	require.NoError(t, e.client.XGroupCreateMkStream(ctx, e.topic, "g", "$").Err())
	logs := newErrorLog(testLogger())
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client,
		Retention: map[string]valkeystream.Retention{e.topic: {MaxLen: retentionMaxLen}}}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	publishBacklog(t, e, pub)
	assert.Less(t, e.client.XLen(ctx, e.topic).Val(), int64(retentionBacklog))
	warnings := 0
	for _, l := range logs.infoLines() {
		if strings.Contains(l, "whether or not consumer groups acknowledged") {
			warnings++
			assert.Contains(t, l, "8.2.7, 8.4.4, or 8.6")
		}
	}
	assert.Equal(t, 1, warnings, "one warning for the topic")
}
