package valkeystream_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/serverinfo"
)

// claimInReads is a config whose claim beat never comes again within a test
// after the first one, at start: only reads can reclaim.
func claimInReads(c *valkeystream.SubscriberConfig) {
	c.BlockTime = 50 * time.Millisecond
	c.ClaimInterval = time.Hour
	c.ClaimMinIdle = 300 * time.Millisecond
	c.AckFlushInterval = 10 * time.Millisecond
}

// On a server with XREADGROUP ... CLAIM, an idle subscription (waiting in
// its blocking read) takes over the entries of a consumer that died without
// waiting for its claim beat, each with its delivery count; with
// BaselineVerbs (or on a server without the verb) it waits for the beat.
// Stats.Verbs says which path runs.
func TestIdleEntriesAreReclaimedInsideReadsWhereTheServerCan(t *testing.T) {
	for _, baseline := range []bool{false, true} {
		t.Run("baseline="+strconv.FormatBool(baseline), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			v, _, err := serverinfo.Probe(ctx, e.client)
			require.NoError(t, err)
			published := e.publish(3)
			require.NoError(t, e.client.XGroupCreate(ctx, e.topic, "g", "0").Err())
			require.NoError(t, e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: "g", Consumer: "dead", Streams: []string{e.topic, ">"}, Count: 3}).Err())

			live := e.subscriber("g", "live", claimInReads, func(c *valkeystream.SubscriberConfig) { c.BaselineVerbs = baseline })
			msgs := e.subscribe(live) // its first claim beat finds nothing idle yet
			wantPath := "baseline"
			if !baseline {
				wantPath = v.String()
			}
			require.Equal(t, wantPath, live.Stats().Verbs)

			if baseline || !v.ClaimInRead {
				expectNothing(t, msgs, 1500*time.Millisecond)
				require.Zero(t, live.Stats().Reclaimed)
				return
			}
			start := time.Now()
			var got []string
			for range published {
				m := receive(t, msgs)
				require.Equal(t, 2, valkeystream.DeliveryCount(m), "delivery count of a reclaimed entry")
				got = append(got, m.UUID)
				m.Ack()
			}
			require.ElementsMatch(t, uuidsOf(published), got)
			t.Logf("reclaimed within %s of subscribing (ClaimMinIdle 300ms, BlockTime 50ms)", time.Since(start).Round(time.Millisecond))
			require.Equal(t, int64(3), live.Stats().Reclaimed)
			require.Eventually(t, func() bool { return len(e.pending("g")) == 0 }, 5*time.Second, 20*time.Millisecond)
		})
	}
}

// DeleteAcked deletes an entry once every group acknowledged it, on a
// server with XACKDEL; on one without, Subscribe says so.
func TestDeleteAckedEmptiesAWorkQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	v, _, err := serverinfo.Probe(ctx, e.client)
	require.NoError(t, err)
	deleting := func(c *valkeystream.SubscriberConfig) { c.DeleteAcked = true }
	a := e.subscriber("a", "c", deleting)
	b := e.subscriber("b", "c", deleting)
	if !v.AckDel {
		_, err := a.Subscribe(ctx, e.topic)
		require.ErrorContains(t, err, "DeleteAcked needs XACKDEL")
		return
	}
	fromA, fromB := e.subscribe(a), e.subscribe(b)
	published := e.publish(5)
	require.ElementsMatch(t, uuidsOf(published), receiveAll(t, fromA, 5))
	require.Eventually(t, func() bool { return len(e.pending("a")) == 0 }, 5*time.Second, 10*time.Millisecond)
	n, err := e.client.XLen(ctx, e.topic).Result()
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "group b has not acknowledged them: they stay")
	require.ElementsMatch(t, uuidsOf(published), receiveAll(t, fromB, 5))
	require.Eventually(t, func() bool {
		n, err := e.client.XLen(ctx, e.topic).Result()
		return err == nil && n == 0
	}, 5*time.Second, 10*time.Millisecond, "acknowledged by both groups: deleted")
	require.Eventually(t, func() bool { return a.Stats().Acked+b.Stats().Acked == 10 }, 5*time.Second, 10*time.Millisecond,
		"each group's Acks are counted as XACK's would be")
}

func TestDeleteAckedNeedsAGroupAndTheNewerVerbs(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	for _, c := range []valkeystream.SubscriberConfig{
		{Client: client, Start: valkeystream.StartNew, DeleteAcked: true},
		{Client: client, Start: valkeystream.StartNew, ConsumerGroup: "g", DeleteAcked: true, BaselineVerbs: true},
	} {
		err := c.Validate()
		require.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
		require.ErrorContains(t, err, "DeleteAcked")
	}
}
