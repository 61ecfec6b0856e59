package valkeystream_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// BenchmarkReclaimDeadConsumer measures how a running subscription takes
// over the entries a consumer left pending when it died (200 000 by
// default; VALKEYSTREAM_BENCH_RECLAIM_ENTRIES sets another number), on each
// path the server allows: claiming inside reads (XREADGROUP ... CLAIM,
// Redis 8.4) and the baseline (XAUTOCLAIM on the claim beat), with
// ClaimMinIdle 2 s and the default ClaimInterval. first-ms is the time from
// the moment the entries had been idle for ClaimMinIdle to the first one
// handled; all-s to the last one handled and acknowledged.
func BenchmarkReclaimDeadConsumer(b *testing.B) {
	n := 200_000
	if s := os.Getenv("VALKEYSTREAM_BENCH_RECLAIM_ENTRIES"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	srv := testserver.Start(b)
	client := newClient(b, srv)
	ctx := context.Background()
	const minIdle = 2 * time.Second
	for _, baseline := range []bool{false, true} {
		name := "path=newer"
		if baseline {
			name = "path=baseline"
		}
		b.Run(name, func(b *testing.B) {
			var first, all time.Duration
			for range b.N {
				topic := "bench-reclaim-" + watermill.NewShortUUID()
				for done := 0; done < n; done += 1000 {
					pipe := client.Pipeline()
					for range min(1000, n-done) {
						pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{"uuid", watermill.NewUUID(), "payload", "0123456789abcdef"}})
					}
					_, err := pipe.Exec(ctx)
					require.NoError(b, err)
				}
				// The group starts at the end, so that the live subscription,
				// running already (its first claim beat, at start, done),
				// finds nothing new; then, in one script, the group goes
				// back to the head and a consumer takes every entry and dies.
				// (In a script, its reply, which would take seconds to come,
				// is one number.)
				require.NoError(b, client.XGroupCreate(ctx, topic, "g", "$").Err())
				sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
					Client: client, ConsumerGroup: "g", Consumer: "live", Start: valkeystream.StartHead,
					ClaimMinIdle: minIdle, BaselineVerbs: baseline,
				}, nil)
				require.NoError(b, err)
				msgs, err := sub.Subscribe(ctx, topic)
				require.NoError(b, err)
				time.Sleep(time.Second) // the subscription's start, its first claim beat included (not seen from here)
				idleAt := time.Now().Add(minIdle)
				require.NoError(b, client.Eval(ctx, `redis.call('XGROUP', 'SETID', KEYS[1], 'g', '0')
redis.call('XREADGROUP', 'GROUP', 'g', 'dead', 'COUNT', ARGV[1], 'STREAMS', KEYS[1], '>') return 1`,
					[]string{topic}, n).Err())
				readTook := time.Until(idleAt.Add(-minIdle)) * -1
				for i := range n {
					m := <-msgs
					if i == 0 {
						first += time.Since(idleAt)
					}
					m.Ack()
				}
				require.Eventually(b, func() bool {
					p, err := client.XPending(ctx, topic, "g").Result()
					return err == nil && p.Count == 0
				}, time.Minute, 10*time.Millisecond)
				all += time.Since(idleAt)
				b.Logf("%s on %s %s: verbs %s, reclaimed %d, dead read took %s, first %s", name, srv.Name(), srv.Version(),
					sub.Stats().Verbs, sub.Stats().Reclaimed, readTook, first)
				require.NoError(b, sub.Close())
				require.NoError(b, client.Del(ctx, topic).Err())
			}
			b.ReportMetric(float64(first.Milliseconds())/float64(b.N), "first-ms")
			b.ReportMetric(all.Seconds()/float64(b.N), "all-s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
