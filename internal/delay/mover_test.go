package delay

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// later is a score no test waits for: a due time in the year 33658.
const later = 1e15

// newClient returns a client of a private server.
func newClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testserver.Start(t).Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newMover returns a Mover through client whose streams, after a failed
// move, wait an hour.
func newMover(client redis.UniversalClient, faults *atomic.Int64) *Mover {
	return NewMover(Config{
		Client:  client,
		Every:   time.Millisecond,
		Faults:  faults,
		Backoff: func(int) time.Duration { return time.Hour },
	})
}

// wait stores the entry of fields in the sorted set key, due at score.
func wait(t *testing.T, client redis.UniversalClient, key string, score float64, fields ...any) {
	t.Helper()
	member, err := EncodeEntry(fields)
	if err != nil {
		t.Fatalf("EncodeEntry(%q): %v", fields, err)
	}
	if err := client.ZAdd(context.Background(), key, redis.Z{Score: score, Member: member}).Err(); err != nil {
		t.Fatalf("ZADD %s: %v", key, err)
	}
}

// entries returns the fields and values of every entry of stream, in order.
func entries(t *testing.T, client redis.UniversalClient, stream string) [][]string {
	t.Helper()
	reply, err := client.Do(context.Background(), "XRANGE", stream, "-", "+").Slice()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	var out [][]string
	for _, e := range reply {
		var fields []string
		for _, f := range e.([]any)[1].([]any) {
			fields = append(fields, f.(string))
		}
		out = append(out, fields)
	}
	return out
}

// count returns a count of key (ZCARD or XLEN, by cmd).
func count(t *testing.T, cmd func(context.Context, string) *redis.IntCmd, key string) int64 {
	t.Helper()
	n, err := cmd(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("counting %s: %v", key, err)
	}
	return n
}

// waitFor fails t unless cond holds within a generous time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// scriptCalls counts the script commands a client sends, by name.
type scriptCalls struct {
	mu    sync.Mutex
	calls map[string]int
}

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.count(cmd)
		return next(ctx, cmd)
	}
}

func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.count(c)
		}
		return next(ctx, cmds)
	}
}

func (s *scriptCalls) count(cmd redis.Cmder) {
	if name := cmd.Name(); name == "evalsha" || name == "eval" {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.calls == nil {
			s.calls = map[string]int{}
		}
		s.calls[name]++
	}
}

func (s *scriptCalls) get() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

// Due entries move earliest first with their fields intact, an entry not
// due stays, and a stream that filled a batch is handed back to be moved
// again.
func TestDelayedMoverMovesDueEntriesEarliestFirst(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	m := newMover(client, new(atomic.Int64))
	m.Add(t.Context(), "a", "{a}:delayed", watermill.NopLogger{})
	m.Add(t.Context(), "b", "{b}:delayed", watermill.NopLogger{})
	wait(t, client, "{a}:delayed", 3, "n", "3", "payload", "")
	wait(t, client, "{a}:delayed", 1, "n", "1", "payload", []byte("a:b\n"))
	wait(t, client, "{a}:delayed", 2, "n", "2", "payload", "2:xy")
	wait(t, client, "{a}:delayed", later, "n", "later")
	for i := range moveBatch + 1 {
		wait(t, client, "{b}:delayed", 1, "n", i)
	}

	again, _ := m.moveOnce(t.Context(), m.due(time.Now()))
	if len(again) != 1 || again[0].keys[1] != "b" {
		t.Fatalf("handed back %d streams, want b alone (it filled a batch)", len(again))
	}
	want := [][]string{{"n", "1", "payload", "a:b\n"}, {"n", "2", "payload", "2:xy"}, {"n", "3", "payload", ""}}
	if got := entries(t, client, "a"); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("stream a holds %q, want %q", got, want)
	}
	if n := count(t, client.ZCard, "{a}:delayed"); n != 1 {
		t.Fatalf("%d entries wait for a, want 1 (the one not due)", n)
	}
	if n := count(t, client.XLen, "b"); n != moveBatch {
		t.Fatalf("stream b holds %d entries after one move, want %d", n, moveBatch)
	}
	if again, _ := m.moveOnce(t.Context(), again); len(again) != 0 {
		t.Fatalf("handed back %d streams after the rest of b, want none", len(again))
	}
	if n, left := count(t, client.XLen, "b"), count(t, client.ZCard, "{b}:delayed"); n != moveBatch+1 || left != 0 {
		t.Fatalf("stream b holds %d entries and %d wait, want %d and 0", n, left, moveBatch+1)
	}
}

// A stream added twice is moved once per beat while either registration
// lasts, and forgotten when both have ended; Run returns when its context
// ends.
func TestDelayedMoverRunsUntilItsContextEnds(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	m := newMover(client, new(atomic.Int64))
	first, endFirst := context.WithCancel(t.Context())
	second, endSecond := context.WithCancel(t.Context())
	m.Add(first, "s", "{s}:delayed", watermill.NopLogger{})
	m.Add(second, "s", "{s}:delayed", watermill.NopLogger{})
	registered := func() (topics, subs int) {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, tp := range m.topics {
			subs += tp.subs
		}
		return len(m.topics), subs
	}
	if topics, subs := registered(); topics != 1 || subs != 2 {
		t.Fatalf("%d streams with %d registrations, want 1 with 2", topics, subs)
	}

	run, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(run)
	}()
	wait(t, client, "{s}:delayed", 1, "n", "1")
	waitFor(t, "the due entry to move", func() bool { return count(t, client.XLen, "s") == 1 })

	endFirst()
	waitFor(t, "one registration to end", func() bool { _, subs := registered(); return subs == 1 })
	wait(t, client, "{s}:delayed", 2, "n", "2")
	waitFor(t, "the second due entry to move", func() bool { return count(t, client.XLen, "s") == 2 })

	endSecond()
	waitFor(t, "the stream to be forgotten", func() bool { topics, _ := registered(); return topics == 0 })
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs 10 s after its context ended")
	}
}

// A stream whose move fails is counted and logged once per streak, waits
// its backoff while the others go on, and resumes once its key is fixed.
func TestDelayedMoverFailureIsCountedLoggedOnceAndBacksOff(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	faults := new(atomic.Int64)
	m := newMover(client, faults)
	log := watermill.NewCaptureLogger()
	m.Add(t.Context(), "bad", "{bad}:delayed", log)
	m.Add(t.Context(), "good", "{good}:delayed", watermill.NopLogger{})
	if err := client.Set(t.Context(), "{bad}:delayed", "not a sorted set", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	wait(t, client, "{good}:delayed", 1, "n", "1")
	logged := func(level watermill.LogLevel) int { return len(log.Captured()[level]) }

	m.moveOnce(t.Context(), m.due(time.Now()))
	if n := count(t, client.XLen, "good"); n != 1 {
		t.Fatalf("stream good holds %d entries beside a failing stream, want 1", n)
	}
	if n, errs := faults.Load(), logged(watermill.ErrorLogLevel); n != 1 || errs != 1 {
		t.Fatalf("%d faults and %d Error lines after one failed move, want 1 and 1", n, errs)
	}
	due := m.due(time.Now())
	if len(due) != 1 || due[0].keys[1] != "good" {
		t.Fatalf("%d streams due right after the failure, want good alone", len(due))
	}
	if due := m.due(time.Now().Add(2 * time.Hour)); len(due) != 2 {
		t.Fatalf("%d streams due after the backoff, want 2", len(due))
	}

	bad := m.topics["bad"]
	m.moveOnce(t.Context(), []*topic{bad})
	if n, errs := faults.Load(), logged(watermill.ErrorLogLevel); n != 2 || errs != 1 {
		t.Fatalf("%d faults and %d Error lines after two failed moves, want 2 and 1", n, errs)
	}

	if err := client.Del(t.Context(), "{bad}:delayed").Err(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	wait(t, client, "{bad}:delayed", 1, "n", "1")
	m.moveOnce(t.Context(), []*topic{bad})
	if n := count(t, client.XLen, "bad"); n != 1 {
		t.Fatalf("stream bad holds %d entries once fixed, want 1", n)
	}
	if infos := logged(watermill.InfoLogLevel); infos != 1 {
		t.Fatalf("%d Info lines on recovery, want 1", infos)
	}
	if due := m.due(time.Now()); len(due) != 2 {
		t.Fatalf("%d streams due after the recovery, want 2", len(due))
	}
}

// Streams without a sorted set cost no script call; a server without the
// script gets its body once (EVAL) and moves.
func TestDelayedMoverCallsTheScriptOnlyWhereEntriesWait(t *testing.T) {
	testserver.Parallel(t)
	client := newClient(t)
	calls := &scriptCalls{}
	client.AddHook(calls)
	m := newMover(client, new(atomic.Int64))
	for _, key := range []string{"a", "b", "c"} {
		m.Add(t.Context(), key, "{"+key+"}:delayed", watermill.NopLogger{})
	}

	m.moveOnce(t.Context(), m.due(time.Now()))
	if got := calls.get(); len(got) != 0 {
		t.Fatalf("script calls %v for streams without delayed messages, want none", got)
	}

	if err := client.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	wait(t, client, "{b}:delayed", 1, "n", "1")
	wait(t, client, "{b}:delayed", later, "n", "later") // keeps the set after the move
	m.moveOnce(t.Context(), m.due(time.Now()))
	if got := calls.get(); got["evalsha"] != 1 || got["eval"] != 1 {
		t.Fatalf("script calls %v on a server without the script, want one EVALSHA and one EVAL", got)
	}
	if n := count(t, client.XLen, "b"); n != 1 {
		t.Fatalf("stream b holds %d entries, want 1", n)
	}
	m.moveOnce(t.Context(), m.due(time.Now()))
	if got := calls.get(); got["evalsha"] != 2 || got["eval"] != 1 {
		t.Fatalf("script calls %v once the server has the script, want two EVALSHA and one EVAL", got)
	}
}

// On a cluster each stream is one call, sent to its slot's master; when
// only some masters have the script, only the calls the others refused go
// again, so no move runs twice.
func TestDelayedMoverOnAClusterMovesEachStreamOnce(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	if err := client.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return node.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatalf("SCRIPT FLUSH on the masters: %v", err)
	}

	m := newMover(client, new(atomic.Int64))
	masters := map[string]bool{}
	var first string
	for i := range 9 {
		key := fmt.Sprintf("s%d", i)
		master, _, err := c.SlotOwner(ctx, key)
		if err != nil {
			t.Fatalf("SlotOwner(%q): %v", key, err)
		}
		if i == 0 {
			first = master
		}
		masters[master] = true
		m.Add(t.Context(), key, "{"+key+"}:delayed", watermill.NopLogger{})
		wait(t, client, "{"+key+"}:delayed", 1, "n", key)
	}
	if len(masters) < 2 {
		t.Fatalf("the streams lie on %d master, want several", len(masters))
	}
	node := redis.NewClient(&redis.Options{Addr: first})
	t.Cleanup(func() { _ = node.Close() })
	if err := moveScript.Load(ctx, node).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD on %s: %v", first, err)
	}

	topics := m.due(time.Now())
	for i, r := range runMoves(ctx, client, topics) {
		if r.err != nil || r.moved != 1 {
			t.Errorf("stream %s: moved %d, error %v; want 1, nil", topics[i].keys[1], r.moved, r.err)
		}
	}
	for _, tp := range topics {
		key := tp.keys[1]
		if got, want := entries(t, client, key), [][]string{{"n", key}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("stream %s holds %q, want %q", key, got, want)
		}
	}
}
