package valkeystream_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/serverinfo"
	"github.com/echomq/valkeystream/internal/testserver"
)

// verbsOf returns the newer stream verbs of the env's server.
func verbsOf(t *testing.T, client redis.UniversalClient) serverinfo.Verbs {
	t.Helper()
	v, _, err := serverinfo.Probe(context.Background(), client)
	require.NoError(t, err)
	return v
}

// eachIdempotentPath runs test on both paths of idempotent publishing,
// each on a server of its own: "xadd-idmp" (skipped where the server has no
// XADD ... IDMP) and "script" (BaselineVerbs, on any server).
func eachIdempotentPath(t *testing.T, test func(t *testing.T, e *env, baseline bool)) {
	t.Run("xadd-idmp", func(t *testing.T) {
		testserver.Parallel(t)
		e := newEnv(t)
		if !verbsOf(t, e.client).IdempotentAdd {
			t.Skipf("%s %s has no XADD ... IDMP (Redis 8.6 and later): the script path runs instead, in the other subtest",
				e.srv.Name(), e.srv.Version())
		}
		test(t, e, false)
	})
	t.Run("script", func(t *testing.T) {
		testserver.Parallel(t)
		test(t, newEnv(t), true)
	})
}

// storedCount returns how many entries of stream key carry each UUID.
func storedCount(t *testing.T, client redis.UniversalClient, key string) map[string]int {
	t.Helper()
	entries, err := client.XRange(context.Background(), key, "-", "+").Result()
	require.NoError(t, err)
	n := map[string]int{}
	for _, en := range entries {
		id, _ := en.Values[valkeystream.FieldUUID].(string)
		n[id]++
	}
	return n
}

func idempotentPublisher(t *testing.T, client redis.UniversalClient, window time.Duration, baseline bool, logger watermill.LoggerAdapter) *valkeystream.Publisher {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: client, IdempotentWindow: window, BaselineVerbs: baseline,
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// A message published again within the window, alone, in a batch with new
// ones, or twice in one call, is stored once, and each Publish succeeds.
func TestIdempotentPublishStoresACopyOnce(t *testing.T) {
	eachIdempotentPath(t, func(t *testing.T, e *env, baseline bool) {
		logs := newErrorLog(testLogger())
		pub := idempotentPublisher(t, e.client, time.Minute, baseline, logs)
		ctx := context.Background()
		first := newMessages(3)
		require.NoError(t, pub.Publish(e.topic, first...))
		// A server that lost the script (SCRIPT FLUSH, a restart, a
		// failover) answers NOSCRIPT: the Publisher loads it and goes on,
		// alone and in a pipeline.
		require.NoError(t, e.client.ScriptFlush(ctx).Err())
		require.NoError(t, pub.Publish(e.topic, first[0]))
		require.NoError(t, e.client.ScriptFlush(ctx).Err())
		fresh := newMessages(2)
		require.NoError(t, pub.Publish(e.topic, first[1], fresh[0], first[2], fresh[1], fresh[1]))
		// Concurrent calls share round trips: copies in one pipeline.
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { assert.NoError(t, pub.Publish(e.topic, first...)) })
		}
		wg.Wait()

		stored := storedCount(t, e.client, e.topic)
		assert.Len(t, stored, 5)
		for _, m := range append(first, fresh...) {
			assert.Equal(t, 1, stored[m.UUID], "entries of %s", m.UUID)
		}
		want := "baseline"
		if !baseline {
			want = verbsOf(t, e.client).String()
		}
		assert.Equal(t, want, pub.Stats().Verbs)
		path := "idempotent_publish:script"
		if !baseline {
			path = "idempotent_publish:xadd-idmp"
		}
		var verbLines []string
		for _, l := range logs.infoLines() {
			if strings.Contains(l, "stream verbs") {
				verbLines = append(verbLines, l)
			}
		}
		require.Len(t, verbLines, 1, "one Info line names the path")
		assert.Contains(t, verbLines[0], path)
	})
}

// A UUID published again after the window is a new entry.
func TestIdempotentPublishAfterTheWindowIsANewEntry(t *testing.T) {
	eachIdempotentPath(t, func(t *testing.T, e *env, baseline bool) {
		pub := idempotentPublisher(t, e.client, time.Second, baseline, testLogger())
		m := newMessages(1)[0]
		require.NoError(t, pub.Publish(e.topic, m))
		require.NoError(t, pub.Publish(e.topic, m))
		require.Equal(t, 1, storedCount(t, e.client, e.topic)[m.UUID], "a copy within the window")
		// The window is a lower bound on the server's memory: wait past it.
		require.Eventually(t, func() bool {
			require.NoError(t, pub.Publish(e.topic, m))
			return storedCount(t, e.client, e.topic)[m.UUID] == 2
		}, receiveTimeout, 250*time.Millisecond, "a copy published after the window must be stored")
	})
}

// republishUntilStored publishes fresh messages from four goroutines
// through pub while storm lasts, each one again after every failure until
// a Publish of it returns nil, and returns the UUIDs published and those
// that some failure listed as maybe written.
func republishUntilStored(t *testing.T, pub *valkeystream.Publisher, topic string, storm <-chan struct{}) (published []string, maybe map[string]bool) {
	var mu sync.Mutex
	maybe = map[string]bool{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-storm:
					return
				default:
				}
				m := message.NewMessage(watermill.NewUUID(), []byte("x"))
				for attempt := 0; ; attempt++ {
					err := pub.Publish(topic, m)
					if err == nil {
						break
					}
					var pe *valkeystream.PublishError
					if !errors.As(err, &pe) {
						t.Errorf("Publish returned %v, not a *PublishError", err)
						return
					}
					mu.Lock()
					for _, id := range pe.MaybeWritten {
						maybe[id] = true
					}
					mu.Unlock()
					if attempt > 1000 {
						t.Errorf("message %s not stored after 1000 attempts: %v", m.UUID, err)
						return
					}
				}
				mu.Lock()
				published = append(published, m.UUID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return published, maybe
}

// During a reset storm, a caller that publishes every failed message again
// until it succeeds stores each message exactly once with IdempotentWindow.
// Without it (the control), such a caller may store a message twice: only
// one that a failure listed as maybe written.
func TestIdempotentPublishDuringAResetStorm(t *testing.T) {
	// storm runs storms of 2 s until shows reports that they showed
	// something (a loaded machine can pass one with few messages and no
	// ambiguous failure), 10 at most.
	storm := func(t *testing.T, e *env, window time.Duration, baseline bool, shows func(stored map[string]int, maybe map[string]bool) bool) (stored map[string]int, published []string, maybe map[string]bool) {
		proxy := testserver.NewProxy(t, e.srv.Addr())
		stormy := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
		t.Cleanup(func() { _ = stormy.Close() })
		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
			Client: stormy, IdempotentWindow: window, BaselineVerbs: baseline,
		}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		maybe = map[string]bool{}
		for round := 1; ; round++ {
			more, maybeMore := republishUntilStored(t, pub, e.topic, proxy.ResetEvery(20*time.Millisecond, 2*time.Second))
			published = append(published, more...)
			for id := range maybeMore {
				maybe[id] = true
			}
			stored = storedCount(t, e.client, e.topic)
			if shows(stored, maybe) || round == 10 {
				break
			}
		}
		stats := pub.Stats()
		t.Logf("%d messages, %d failed calls, %d maybe written, %d resets",
			len(published), stats.FailedCalls, len(maybe), proxy.Stats().Reset)
		return stored, published, maybe
	}
	eachIdempotentPath(t, func(t *testing.T, e *env, baseline bool) {
		// Copies the server caught: the adds it ran beyond one per
		// message (the client's retries, and the caller's).
		copies := func(stored map[string]int) int64 {
			ran := succeededCalls(t, e.client, "xadd")
			if baseline {
				ran = succeededCalls(t, e.client, "evalsha") + succeededCalls(t, e.client, "eval")
			}
			return ran - int64(len(stored))
		}
		stored, published, maybe := storm(t, e, time.Minute, baseline, func(stored map[string]int, maybe map[string]bool) bool {
			return copies(stored) > 0 || len(maybe) > 0
		})
		caught := copies(stored)
		t.Logf("the server caught %d copies", caught)
		require.True(t, caught > 0 || len(maybe) > 0,
			"no copy was sent and no message was left maybe written: the storm shows nothing")
		assert.Len(t, stored, len(published))
		for _, id := range published {
			assert.Equal(t, 1, stored[id], "entries of %s", id)
		}
	})
	t.Run("control", func(t *testing.T) {
		testserver.Parallel(t)
		e := newEnv(t)
		stored, published, maybe := storm(t, e, 0, false, func(map[string]int, map[string]bool) bool { return true })
		twice := 0
		for _, id := range published {
			switch n := stored[id]; {
			case n == 0:
				t.Errorf("%s was published but is not stored", id)
			case n > 1:
				twice++
				assert.True(t, maybe[id], "%s stored %d times, but no failure said it may have been written", id, n)
			}
		}
		if twice == 0 {
			t.Logf("without IdempotentWindow no message was stored twice in this run (%d maybe written)", len(maybe))
		} else {
			t.Logf("without IdempotentWindow %d of %d messages were stored twice", twice, len(published))
		}
	})
}

// succeededCalls returns how many calls of command the server ran without
// an error reply (INFO commandstats).
func succeededCalls(t *testing.T, client *redis.Client, command string) int64 {
	t.Helper()
	info, err := client.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		stats, found := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !found {
			continue
		}
		var calls, failed int64
		for field := range strings.SplitSeq(stats, ",") {
			name, value, _ := strings.Cut(field, "=")
			n, _ := strconv.ParseInt(value, 10, 64)
			switch name {
			case "calls":
				calls = n
			case "failed_calls":
				failed = n
			}
		}
		return calls - failed
	}
	return 0
}

// xinfoStream returns the fields of XINFO STREAM key, RESP2 or RESP3.
func xinfoStream(t *testing.T, client redis.UniversalClient, key string) map[string]any {
	t.Helper()
	reply, err := client.Do(context.Background(), "XINFO", "STREAM", key).Result()
	require.NoError(t, err)
	out := map[string]any{}
	switch r := reply.(type) {
	case map[any]any:
		for k, v := range r {
			out[k.(string)] = v
		}
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			out[r[i].(string)] = r[i+1]
		}
	}
	return out
}

// On the IDMP path the Publisher sets the stream's IDMP-DURATION to the
// window (rounded up to whole seconds) and IDMP-MAXSIZE to 10000, creating
// a missing stream empty, with no group; another Publisher with the same
// window keeps what the server remembers, and one with another window
// makes it forget (why every Publisher of a stream must use the same).
func TestIdempotentPublishAppliesTheWindow(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	if !verbsOf(t, e.client).IdempotentAdd {
		t.Skipf("%s %s has no XADD ... IDMP (Redis 8.6 and later): nothing to configure", e.srv.Name(), e.srv.Version())
	}
	const window = 2500 * time.Millisecond
	pub := idempotentPublisher(t, e.client, window, false, testLogger())
	m := newMessages(1)[0]
	require.NoError(t, pub.Publish(e.topic, m))
	info := xinfoStream(t, e.client, e.topic)
	assert.EqualValues(t, 3, info["idmp-duration"], "IDMP-DURATION of a %s window", window)
	assert.EqualValues(t, 10000, info["idmp-maxsize"])
	assert.EqualValues(t, 1, info["length"])
	assert.EqualValues(t, 1, info["entries-added"], "the stream was created without an entry")
	assert.EqualValues(t, 0, info["groups"], "the stream was created without a group")

	again := idempotentPublisher(t, e.client, window, false, testLogger())
	require.NoError(t, again.Publish(e.topic, m))
	assert.Equal(t, 1, storedCount(t, e.client, e.topic)[m.UUID], "a Publisher with the same window must not reset the server's memory")
	assert.EqualValues(t, 1, xinfoStream(t, e.client, e.topic)["iids-duplicates"])

	other := idempotentPublisher(t, e.client, 2*window, false, testLogger())
	require.NoError(t, other.Publish(e.topic, m))
	assert.Equal(t, 2, storedCount(t, e.client, e.topic)[m.UUID], "another window resets the server's memory (docs say: use one window per stream)")
	assert.EqualValues(t, 5, xinfoStream(t, e.client, e.topic)["idmp-duration"])

	// An existing stream with a group keeps its group and entries.
	require.NoError(t, e.client.XGroupCreateMkStream(ctx, "with-group", "g", "0").Err())
	require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: "with-group", Values: []any{"f", "v"}}).Err())
	require.NoError(t, pub.Publish("with-group", newMessages(1)...))
	info = xinfoStream(t, e.client, "with-group")
	assert.EqualValues(t, 2, info["length"])
	assert.EqualValues(t, 1, info["groups"])
	assert.EqualValues(t, 3, info["idmp-duration"])
}

// On a cluster, the script path's mark key lies in the stream's slot,
// whether the topic has a hash tag or not (a key in another slot would
// fail the script with CROSSSLOT).
func TestIdempotentPublishClusterKeepsTheMarkInTheStreamSlot(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	c := testserver.StartCluster(t)
	cc := clusterClient(t, c)
	pub := idempotentPublisher(t, cc, time.Minute, true, testLogger())
	for _, topic := range []string{"idmp-plain", "{idmp}-tagged"} {
		msgs := newMessages(3)
		require.NoError(t, pub.Publish(topic, msgs...), "Publish to %s", topic)
		require.NoError(t, pub.Publish(topic, msgs...), "Publish of copies to %s", topic)
		stored := storedCount(t, cc, topic)
		for _, m := range msgs {
			assert.Equal(t, 1, stored[m.UUID], "entries of %s in %s", m.UUID, topic)
		}
		mark := "{" + topic + "}:idmp:" + msgs[0].UUID
		if strings.Contains(topic, "{") {
			mark = topic + ".idmp:" + msgs[0].UUID
		}
		streamSlot := cc.ClusterKeySlot(ctx, topic).Val()
		assert.Equal(t, streamSlot, cc.ClusterKeySlot(ctx, mark).Val(), "slot of %s", mark)
		ttl := cc.PTTL(ctx, mark).Val()
		assert.Positive(t, ttl, "mark %s must exist and expire", mark)
		assert.LessOrEqual(t, ttl, time.Minute)
	}
}
