package delay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestDelayedMoverBeat(t *testing.T) {
	for _, tc := range []struct {
		name        string
		every, idle time.Duration
		hot         bool
		want        time.Duration
	}{
		{"never saw a sorted set", 100 * time.Millisecond, time.Second, false, time.Second},
		{"saw one", 100 * time.Millisecond, time.Second, true, 100 * time.Millisecond},
		{"idle beat off", 100 * time.Millisecond, 0, false, 100 * time.Millisecond},
		{"idle beat not longer", 100 * time.Millisecond, 50 * time.Millisecond, false, 100 * time.Millisecond},
	} {
		if got := beat(tc.every, tc.idle, tc.hot); got != tc.want {
			t.Errorf("%s: beat = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// idleMover returns a Mover through client that beats every millisecond
// while hot and every hour while idle.
func idleMover(client redis.UniversalClient) *Mover {
	return NewMover(Config{
		Client:  client,
		Every:   time.Millisecond,
		Idle:    time.Hour,
		Faults:  new(atomic.Int64),
		Backoff: func(int) time.Duration { return time.Hour },
	})
}

// run runs m until the test ends.
func run(t *testing.T, m *Mover) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// exists counts the EXISTS commands a client sent and got a reply to.
func exists(client *redis.Client) *atomic.Int64 {
	var n atomic.Int64
	client.AddHook(hook(func(cmd redis.Cmder) {
		if cmd.Name() == "exists" {
			n.Add(1)
		}
	}))
	return &n
}

// A round tells whether a stream of it has a sorted set.
func TestDelayedMoverRoundFindsSortedSets(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	m := idleMover(client)
	m.Add(t.Context(), "a", "{a}:delayed", watermill.NopLogger{})
	if _, found := m.moveOnce(t.Context(), m.due(time.Now())); found {
		t.Error("a round found a sorted set where there is none")
	}
	wait(t, client, "{a}:delayed", later, "n", "later")
	if _, found := m.moveOnce(t.Context(), m.due(time.Now())); !found {
		t.Error("a round did not find the sorted set of its stream")
	}
}

// An idle Mover (whose streams had no sorted set) does not look again for
// its idle beat, an hour; a Notify of its stream brings a round at once,
// which finds the sorted set and keeps the fast beat, so that an entry
// that becomes due later is moved.
func TestDelayedMoverIdleUntilNotified(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	checks := exists(client)
	m := idleMover(client)
	key := "stream-" + watermill.NewShortUUID() // Notify reaches every Mover of the process
	m.Add(t.Context(), key, "{"+key+"}:delayed", watermill.NopLogger{})
	run(t, m)
	waitFor(t, "the round after Add", func() bool { return checks.Load() >= 1 })

	// Another process stores a delayed message: an idle Mover does not see
	// it for an hour. 200 ms is 200 fast beats.
	wait(t, client, "{"+key+"}:delayed", 1, "n", "due")
	time.Sleep(200 * time.Millisecond) // the time is the scenario: nothing may look within it
	if n := checks.Load(); n != 1 {
		t.Fatalf("an idle Mover looked %d times in 200 ms, want once (after Add)", n)
	}
	if n := count(t, client.XLen, key); n != 0 {
		t.Fatalf("an idle Mover moved %d entries before its idle beat", n)
	}

	Notify(key)
	waitFor(t, "the due entry is moved after Notify", func() bool { return count(t, client.XLen, key) == 1 })
	// The round found the set (it held the entry): the beat stays fast, and
	// an entry stored later by another process is moved when due.
	wait(t, client, "{"+key+"}:delayed", 1, "n", "later")
	waitFor(t, "the second entry is moved on the fast beat", func() bool { return count(t, client.XLen, key) == 2 })
}

// Notify reaches only the Movers of the stream, and none once its
// registration ended.
func TestDelayedNotifyReachesTheMoversOfTheStream(t *testing.T) {
	m := NewMover(Config{Every: time.Millisecond})
	key := "stream-" + watermill.NewShortUUID()
	ctx, cancel := context.WithCancel(context.Background())
	m.Add(ctx, key, "{"+key+"}:delayed", watermill.NopLogger{})
	<-m.wake // the signal of Add

	Notify(key + "-other")
	select {
	case <-m.wake:
		t.Fatal("Notify of another stream woke the Mover")
	default:
	}
	Notify(key)
	select {
	case <-m.wake:
	default:
		t.Fatal("Notify of its stream did not wake the Mover")
	}
	cancel()
	waitFor(t, "the registration ends", func() bool {
		local.mu.Lock()
		defer local.mu.Unlock()
		return len(local.movers[key]) == 0
	})
	Notify(key)
	select {
	case <-m.wake:
		t.Fatal("Notify woke a Mover whose registration ended")
	default:
	}
}

// hook is a go-redis hook that sees every command, alone or in a
// pipeline, once its reply has come.
type hook func(redis.Cmder)

func (h hook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h(cmd)
		return err
	}
}

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h(c)
		}
		return err
	}
}
