package valkeystream_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	delaymove "github.com/echomq/valkeystream/internal/delay"
	"github.com/echomq/valkeystream/internal/testserver"
)

// commandStat is what INFO commandstats says of one command.
type commandStat struct{ calls, usec int64 }

// commandStats returns INFO commandstats by command name, and the server's
// CPU time (user plus system) in microseconds.
func (e *env) commandStats() (map[string]commandStat, int64) {
	e.t.Helper()
	var info string
	for _, section := range []string{"commandstats", "cpu"} { // one by one: Redis 6.2 takes one section
		text, err := e.client.Info(context.Background(), section).Result()
		require.NoError(e.t, err)
		info += text
	}
	stats := map[string]commandStat{}
	var cpu float64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			name, fields, _ := strings.Cut(rest, ":")
			var s commandStat
			for _, f := range strings.Split(fields, ",") {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "calls":
					s.calls, _ = strconv.ParseInt(v, 10, 64)
				case "usec":
					s.usec, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			stats[name] = s
			continue
		}
		for _, key := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, key); ok {
				f, err := strconv.ParseFloat(v, 64)
				require.NoError(e.t, err)
				cpu += f
			}
		}
	}
	return stats, int64(cpu * 1e6)
}

// idleSeconds is how long TestIdleSubscriberChecksForDelayedMessagesRarely
// watches an idle Subscriber: VALKEYSTREAM_IDLE_SECONDS, or 3.
func idleSeconds(t *testing.T) time.Duration {
	s := os.Getenv("VALKEYSTREAM_IDLE_SECONDS")
	if s == "" {
		return 3 * time.Second
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "VALKEYSTREAM_IDLE_SECONDS")
	return time.Duration(n) * time.Second
}

// A Subscriber whose topics never had a delayed message looks for them once
// per DelayedIdlePollInterval, not on every DelayedPollInterval beat: the
// server runs EXISTS about once a second and the move script never. The
// figures (commands and server CPU per second, the mover's share) are
// logged, beside those of a Subscriber with AlwaysPollDelayed.
func TestIdleSubscriberChecksForDelayedMessagesRarely(t *testing.T) {
	testserver.Parallel(t)
	watch := idleSeconds(t)
	for _, topics := range []int{1, 100} {
		for _, idle := range []time.Duration{0, valkeystream.AlwaysPollDelayed} {
			name := fmt.Sprintf("%d topics, idle beat", topics)
			if idle == valkeystream.AlwaysPollDelayed {
				name = fmt.Sprintf("%d topics, AlwaysPollDelayed", topics)
			}
			t.Run(name, func(t *testing.T) {
				testserver.Parallel(t) // each on a server of its own, whose commands it counts
				exists, window := idleCost(t, topics, idle, watch)
				if idle == valkeystream.AlwaysPollDelayed {
					return // the figures to compare with
				}
				// One check per DelayedIdlePollInterval, and one beat's slack.
				// (window is from before the first INFO to after the last.)
				want := int64(window/valkeystream.DefaultDelayedIdlePollInterval) + 1
				if exists > want {
					t.Errorf("the idle mover ran EXISTS %d times in %s, want at most %d (one per DelayedIdlePollInterval, %s)",
						exists, window.Round(time.Millisecond), want, valkeystream.DefaultDelayedIdlePollInterval)
				}
			})
		}
	}
}

// idleCost watches, for watch, a fan-out Subscriber of topics topics that
// never see a delayed message, with DelayedIdlePollInterval idle; it logs
// what the server did meanwhile and returns how many EXISTS it ran, and in
// how long a window (from before the first INFO to after the last).
func idleCost(t *testing.T, topics int, idle, watch time.Duration) (int64, time.Duration) {
	e := newEnv(t)
	// Each fan-out subscription holds a connection while it blocks: the
	// pool has one for each, and more (docs/configuration.md, Client).
	// With fewer, each Subscribe past the pool waited for a blocked read to
	// time out.
	client := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), PoolSize: topics + 16})
	t.Cleanup(func() { _ = client.Close() })
	sub := e.subscriber("", "", onClient(client), func(c *valkeystream.SubscriberConfig) {
		c.Start = valkeystream.StartNew
		c.DelayedIdlePollInterval = idle
	})
	for i := range topics {
		e.subscribeTo(sub, fmt.Sprintf("%s-%d", e.topic, i))
	}
	waitUntil(t, "the subscriptions are ready", func() bool {
		subs := sub.Subscriptions()
		for _, s := range subs {
			if !s.Ready {
				return false
			}
		}
		return len(subs) == topics
	})
	time.Sleep(time.Second) // the first rounds after Subscribe
	start := time.Now()
	before, cpuBefore := e.commandStats()
	time.Sleep(watch) // the time is the scenario: the window watched
	after, cpuAfter := e.commandStats()
	window := time.Since(start)
	elapsed := window.Seconds()

	var calls, usec int64
	for name, s := range after {
		if name == "info" {
			continue
		}
		calls += s.calls - before[name].calls
		usec += s.usec - before[name].usec
	}
	exists := after["exists"].calls - before["exists"].calls
	existsUsec := after["exists"].usec - before["exists"].usec
	scripts := after["evalsha"].calls - before["evalsha"].calls + after["eval"].calls - before["eval"].calls
	beat := "the idle beat"
	if idle == valkeystream.AlwaysPollDelayed {
		beat = "AlwaysPollDelayed"
	}
	t.Logf("idle Subscriber, %d topics, %s, %.1f s: all commands %.1f/s, %.1f µs/s in commands, server CPU %.0f µs/s; "+
		"EXISTS %.1f/s (%.1f µs/s, %.1f µs each), scripts %.1f/s",
		topics, beat, elapsed, float64(calls)/elapsed, float64(usec)/elapsed, float64(cpuAfter-cpuBefore)/elapsed,
		float64(exists)/elapsed, float64(existsUsec)/elapsed, float64(existsUsec)/float64(max(exists, 1)), float64(scripts)/elapsed)
	return exists, window
}

// storeDelayedElsewhere stores msg in the sorted set of topic, due after
// wait by the server's clock, as a Publisher of another process would: no
// Subscriber of this process hears of it. It returns the due time by this
// host's clock, at the latest.
func (e *env) storeDelayedElsewhere(topic string, msg *message.Message, wait time.Duration) time.Time {
	e.t.Helper()
	ctx := context.Background()
	fields, err := valkeystream.DefaultMarshaler{}.Marshal(topic, msg)
	require.NoError(e.t, err)
	member, err := delaymove.EncodeEntry(fields)
	require.NoError(e.t, err)
	key, err := valkeystream.DelayedKey(topic)
	require.NoError(e.t, err)
	now, err := e.client.Time(ctx).Result()
	require.NoError(e.t, err)
	require.NoError(e.t, e.client.ZAdd(ctx, key, redis.Z{Score: float64(now.Add(wait).UnixMilli()), Member: member}).Err())
	return time.Now().Add(wait)
}

// A delayed message stored by another process for a topic whose Subscriber
// is idle (it never saw a delayed message) is seen on the idle beat: one
// delayed for longer than DelayedIdlePollInterval is moved on the fast
// beat after its due time, one delayed less is moved on the idle beat.
// Never early either way; how late is logged.
func TestDelayedMessageFromAnotherProcessReachesAnIdleSubscriber(t *testing.T) {
	testserver.Parallel(t)
	for _, wait := range []time.Duration{valkeystream.DefaultDelayedIdlePollInterval + 500*time.Millisecond, 300 * time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			e := newEnv(t)
			sub := e.subscriber("g", "c")
			got := collectArrivals(e.subscribe(sub))
			waitUntil(t, "the subscription is ready", func() bool {
				subs := sub.Subscriptions()
				return len(subs) == 1 && subs[0].Ready
			})
			time.Sleep(valkeystream.DefaultDelayedIdlePollInterval / 2) // past the round after Subscribe

			msg := message.NewMessage(watermill.NewUUID(), []byte("elsewhere"))
			stored := time.Now()
			due := e.storeDelayedElsewhere(e.topic, msg, wait)
			waitUntil(t, "the delayed message arrives", func() bool { return got.count() == 1 })
			a := got.arrivals()[0]
			if a.at.Before(stored.Add(wait)) {
				t.Errorf("the message arrived %s before it was due", stored.Add(wait).Sub(a.at))
			}
			if lateBy := a.at.Sub(due); lateBy > 5*time.Second && assertTimings {
				t.Errorf("the message arrived %s after it was due, want within 5s", lateBy)
			}
			t.Logf("delayed %s by another process to an idle Subscriber: arrived %s after its due time (bound: %s)",
				wait, a.at.Sub(due).Round(time.Millisecond),
				max(valkeystream.DefaultDelayedPollInterval, valkeystream.DefaultDelayedIdlePollInterval-wait))
		})
	}
}

// A Publisher of this process that stores a delayed message wakes the
// idle Subscribers of the process that move its topic: with an idle beat
// of an hour, the message still arrives when due.
func TestDelayedPublishWakesAnIdleSubscriberOfTheProcess(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.DelayedIdlePollInterval = time.Hour })
	got := collectArrivals(e.subscribe(sub))
	waitUntil(t, "the subscription is ready", func() bool {
		subs := sub.Subscriptions()
		return len(subs) == 1 && subs[0].Ready
	})
	time.Sleep(200 * time.Millisecond) // past the round after Subscribe: idle now

	made := time.Now()
	require.NoError(t, e.publisher().Publish(e.topic, delayed("x", delay.For(200*time.Millisecond))))
	waitUntil(t, "the delayed message arrives", func() bool { return got.count() == 1 })
	a := got.arrivals()[0]
	if a.at.Before(made.Add(200 * time.Millisecond)) {
		t.Errorf("the message arrived %s before it was due", made.Add(200*time.Millisecond).Sub(a.at))
	}
	t.Logf("delayed 200ms by a Publisher of the process to an idle Subscriber: arrived %s after its due time",
		a.at.Sub(made.Add(200*time.Millisecond)).Round(time.Millisecond))
}
