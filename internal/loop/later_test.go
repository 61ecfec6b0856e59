package loop

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The deferred set's decisions (RetryAfter, GiveUp), against the fake
// server; what the server does with the calls is proven against real
// servers in the root package's verdict tests.

// nackAfter marks m to come back after d, and Nacks it.
func nackAfter(m *message.Message, d time.Duration) {
	m.Metadata.Set(MetadataRetryAfter, d.String())
	m.Nack()
}

// logHas reports whether log has the line want.
func logHas(log []string, want string) bool { return slices.Contains(log, want) }

func TestLaterKeepsEntriesByDueTime(t *testing.T) {
	var gauge atomic.Int64
	s := newLater(3, &gauge)
	now := time.Now()
	for _, e := range []struct {
		id string
		in time.Duration
	}{{"a", 3 * time.Second}, {"b", time.Second}, {"c", 2 * time.Second}} {
		if !s.add(e.id, 1, now.Add(e.in)) {
			t.Fatalf("add %s refused with %d kept, want room for 3", e.id, s.len())
		}
	}
	if s.add("d", 1, now) {
		t.Fatal("a fourth entry was kept in a set of at most 3")
	}
	if got := gauge.Load(); got != 3 {
		t.Fatalf("gauge %d, want 3", got)
	}
	if got, want := s.ids(), []string{"b", "c", "a"}; !slices.Equal(got, want) {
		t.Fatalf("ids %v, want %v (earliest due first)", got, want)
	}
	if _, ok := s.take(now); ok {
		t.Fatal("took an entry before any was due")
	}
	if got := s.until(now); got != time.Second {
		t.Fatalf("until %s, want 1s", got)
	}
	if e, ok := s.take(now.Add(time.Second)); !ok || e.id != "b" {
		t.Fatalf("took %q (%v) at b's due time, want b", e.id, ok)
	}
	// c is due in 1 s, a in 2 s: with a threshold of 1.5 s, c is handed back
	// idle 0.5 s (a peer takes it 1 s from now), a idle 0 (after 1.5 s).
	back := s.leave(now.Add(time.Second), 1500*time.Millisecond)
	want := []Later{{ID: "c", Idle: 500 * time.Millisecond}, {ID: "a", Idle: 0}}
	if !slices.Equal(back, want) {
		t.Fatalf("handed back %v, want %v", back, want)
	}
	if got := gauge.Load(); got != 0 || s.len() != 0 {
		t.Fatalf("after leave: gauge %d, %d kept; want 0, 0", got, s.len())
	}
}

func TestLaterKeepDropsEntriesNotHeldAnyMore(t *testing.T) {
	var gauge atomic.Int64
	s := newLater(10, &gauge)
	now := time.Now()
	for i, id := range []string{"a", "b", "c"} {
		s.add(id, 1, now.Add(time.Duration(i)*time.Second))
	}
	missing := s.keep([]int64{2, 0, -1}) // b taken over, c's body gone
	if !slices.Equal(missing, []string{"c"}) {
		t.Fatalf("missing %v, want [c]", missing)
	}
	if got := s.ids(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("kept %v, want [a]", got)
	}
	s.forget("a")
	if s.len() != 0 || gauge.Load() != 0 {
		t.Fatalf("after forget: %d kept, gauge %d; want 0, 0", s.len(), gauge.Load())
	}
}

// Rule: an entry Nacked to come back later does not hold the others up: the
// loop delivers the next entries meanwhile. On leave it is handed back with
// an idle time that makes a peer take it when it is due: due in an hour,
// later than ClaimMinIdle (a minute), it is handed back idle 0.
func TestARetryLaterLetsTheOthersFlowOn(t *testing.T) {
	srv := newFakeServer(3)
	cfg := testConfig()
	deps := testDeps(srv)
	out, cancel, done := runWith(t, cfg, deps)
	first := receive(t, out)
	if first.UUID != "1-0" {
		t.Fatalf("first delivery %s, want 1-0", first.UUID)
	}
	nackAfter(first, time.Hour)
	for _, want := range []string{"2-0", "3-0"} {
		m := receive(t, out)
		if m.UUID != want {
			t.Fatalf("delivered %s after 1-0 was deferred, want %s", m.UUID, want)
		}
		m.Ack()
	}
	if got := deps.Counters.Nacks.Deferred.Load(); got != 1 {
		t.Fatalf("Deferred gauge %d, want 1", got)
	}
	cancel()
	<-done
	log := srv.calls()
	if !logHas(log, "handback-later 1-0@0s") {
		t.Fatalf("1-0 was not handed back idle 0; log:\n%s", strings.Join(log, "\n"))
	}
	if logHas(log, "claimback 1-0") {
		t.Fatalf("1-0 was claimed back before it was due; log:\n%s", strings.Join(log, "\n"))
	}
	if got := deps.Counters.Nacks.RetriesLater.Load(); got != 1 {
		t.Fatalf("RetriesLater %d, want 1", got)
	}
	if got := deps.Counters.Nacks.Deferred.Load(); got != 0 {
		t.Fatalf("Deferred gauge %d after the end, want 0", got)
	}
}

// Rule: a deferred entry handed back on leave gets the idle time that makes
// a peer's claim take it when it is due: ClaimMinIdle less the time left.
func TestADeferredEntryIsHandedBackForItsDueTime(t *testing.T) {
	srv := newFakeServer(1)
	cfg := testConfig() // ClaimMinIdle: a minute
	out, cancel, done := run(t, cfg, srv, nil)
	nackAfter(receive(t, out), 20*time.Second)
	cancel()
	<-done
	var idle time.Duration
	for _, line := range srv.calls() {
		if v, ok := strings.CutPrefix(line, "handback-later 1-0@"); ok {
			idle, _ = time.ParseDuration(v)
		}
	}
	// 40 s, plus the time that passed since the Nack (less than the 20 s
	// that would make it due).
	if idle < 40*time.Second || idle >= time.Minute {
		t.Fatalf("handed back idle %s, want 40s (up to a minute); log:\n%s", idle, strings.Join(srv.calls(), "\n"))
	}
}

// Rule: a deferred entry that is due is claimed back (its count grows) and
// delivered next.
func TestADueEntryComesBackWithItsCountGrown(t *testing.T) {
	srv := newFakeServer(1)
	out, _, _ := run(t, testConfig(), srv, nil)
	m := receive(t, out)
	nackAfter(m, 5*time.Millisecond)
	again := receive(t, out)
	if again.UUID != "1-0" || again.Metadata.Get(MetadataDeliveryCount) != "2" {
		t.Fatalf("came back %s with count %s, want 1-0 with 2", again.UUID, again.Metadata.Get(MetadataDeliveryCount))
	}
	if again.Metadata.Get(MetadataRetryAfter) != "" {
		t.Fatal("the redelivered message still carries the retry-after of the last delivery")
	}
	again.Ack()
	if log := srv.calls(); !logHas(log, "claimback 1-0") {
		t.Fatalf("no claim back; log:\n%s", strings.Join(log, "\n"))
	}
}

// Rule: a deferred entry is covered by the hold beat like a queued one, so
// that no peer reclaims it before it is due, even while nothing else is
// held; one that another consumer took over meanwhile is dropped.
func TestTheHoldCoversDeferredEntries(t *testing.T) {
	srv := newFakeServer(2)
	cfg := testConfig()
	cfg.ClaimMinIdle = 30 * time.Millisecond // a beat every 10 ms
	held := make(chan []string, 16)
	srv.onHold = func(ids []string, _ []int64) {
		select {
		case held <- ids:
		default:
		}
	}
	deps := testDeps(srv)
	out, cancel, done := runWith(t, cfg, deps)
	nackAfter(receive(t, out), time.Hour)
	nackAfter(receive(t, out), time.Hour)
	// Nothing else is held now: only the deferred entries keep the beat.
	deadline := time.After(10 * time.Second)
	for covered := false; !covered; {
		select {
		case ids := <-held:
			covered = slices.Equal(ids, []string{"1-0", "2-0"})
		case <-deadline:
			t.Fatalf("no hold beat covered the deferred entries; log:\n%s", strings.Join(srv.calls(), "\n"))
		}
	}
	srv.take("1-0")
	for deps.Counters.Nacks.Deferred.Load() != 1 {
		select {
		case <-held:
		case <-deadline:
			t.Fatalf("the entry taken over is still deferred; log:\n%s", strings.Join(srv.calls(), "\n"))
		}
	}
	cancel()
	<-done
	log := srv.calls()
	if logHas(log, "handback-later 1-0@0s") || !logHas(log, "handback-later 2-0@0s") {
		t.Fatalf("want only 2-0 handed back; log:\n%s", strings.Join(log, "\n"))
	}
}

// Rule: the drain after a fault reads the own pending list, deferred entries
// included: they stay deferred, not delivered before they are due.
func TestTheDrainLeavesDeferredEntriesDeferred(t *testing.T) {
	srv := newFakeServer(2)
	out, _, _ := run(t, testConfig(), srv, nil)
	nackAfter(receive(t, out), time.Hour)
	m := receive(t, out)
	srv.mu.Lock()
	srv.readErr = errors.New("connection reset")
	srv.mu.Unlock()
	m.Ack()
	srv.add(1)
	if m := receive(t, out); m.UUID != "3-0" {
		t.Fatalf("after the fault delivered %s, want 3-0 (1-0 is deferred)", m.UUID)
	}
	log := srv.calls()
	if !slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "drain") && l != "drain " }) {
		t.Fatalf("the test shows nothing: no drain after the fault read an entry; log:\n%s", strings.Join(log, "\n"))
	}
}

// Rule: the deferred set is bounded (BatchSize): a retry-later beyond it
// waits the Nack delay and comes back before newer entries, as a Nack does.
func TestAFullDeferredSetFallsBackToTheNackWait(t *testing.T) {
	srv := newFakeServer(3)
	cfg := testConfig()
	cfg.BatchSize = 2
	deps := testDeps(srv)
	out, _, _ := runWith(t, cfg, deps)
	nackAfter(receive(t, out), time.Hour)
	nackAfter(receive(t, out), time.Hour)
	nackAfter(receive(t, out), time.Hour)
	m := receive(t, out)
	if m.UUID != "3-0" || m.Metadata.Get(MetadataDeliveryCount) != "2" {
		t.Fatalf("delivered %s (count %s), want 3-0 again with count 2", m.UUID, m.Metadata.Get(MetadataDeliveryCount))
	}
	m.Ack()
	if got := deps.Counters.Nacks.LaterFallbacks.Load(); got != 1 {
		t.Fatalf("LaterFallbacks %d, want 1", got)
	}
}

// Rule: a message its handler gave up on is dealt with (Deps.GiveUp, with
// its reason and count) and acknowledged, not delivered again; when that
// fails, it stays pending, unacknowledged and not redelivered.
func TestAGiveUpIsDeadLetteredAndAcknowledged(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "copied", true: "copy failed"}[fail], func(t *testing.T) {
			srv := newFakeServer(2)
			deps := testDeps(srv)
			var mu sync.Mutex
			var gave []string
			deps.Handling.GiveUp = func(_ context.Context, msg *message.Message, count int64, reason string) error {
				mu.Lock()
				defer mu.Unlock()
				gave = append(gave, msg.UUID+"#"+reason)
				if fail {
					return errors.New("WRONGTYPE")
				}
				return nil
			}
			cfg := testConfig()
			cfg.AckFlushInterval = -1 // every Ack at once
			out, cancel, done := runWith(t, cfg, deps)
			m := receive(t, out)
			m.Metadata.Set(MetadataGiveUp, "card declined")
			m.Nack()
			next := receive(t, out)
			if next.UUID != "2-0" {
				t.Fatalf("delivered %s after the give-up, want 2-0", next.UUID)
			}
			next.Ack()
			cancel()
			<-done
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(gave, []string{"1-0#card declined"}) {
				t.Fatalf("given up %v, want [1-0#card declined]", gave)
			}
			log := srv.calls()
			acked := slices.ContainsFunc(log, func(l string) bool { return strings.HasPrefix(l, "ack 1-0") })
			if acked == fail {
				t.Fatalf("1-0 acknowledged: %v, want %v; log:\n%s", acked, !fail, strings.Join(log, "\n"))
			}
			if logHas(log, "claimback 1-0") || logHas(log, "handback 1-0") {
				t.Fatalf("1-0 came back or was handed back; log:\n%s", strings.Join(log, "\n"))
			}
			wantGiven, wantFaults := int64(1), int64(0)
			if fail {
				wantGiven, wantFaults = 0, 1
			}
			if got := deps.Counters.Nacks.GivenUp.Load(); got != wantGiven {
				t.Fatalf("GivenUp %d, want %d", got, wantGiven)
			}
			if got := deps.Counters.Faults.Load(); got != wantFaults {
				t.Fatalf("Faults %d, want %d", got, wantFaults)
			}
		})
	}
}

// Rule: a verdict comes only from the handler: a message published with the
// verdict keys is delivered without them.
func TestPublishedVerdictKeysAreRemoved(t *testing.T) {
	srv := newFakeServer(1)
	deps := testDeps(srv)
	decode := deps.Handling.Decode
	deps.Handling.Decode = func(e Entry) (*message.Message, error) {
		msg, err := decode(e)
		msg.Metadata.Set(MetadataGiveUp, "stale")
		msg.Metadata.Set(MetadataRetryAfter, "1h")
		return msg, err
	}
	out, _, _ := runWith(t, testConfig(), deps)
	m := receive(t, out)
	if _, ok := m.Metadata[MetadataGiveUp]; ok || m.Metadata.Get(MetadataRetryAfter) != "" {
		t.Fatalf("delivered with verdict keys: %v", m.Metadata)
	}
	m.Nack()
	if again := receive(t, out); again.UUID != "1-0" {
		t.Fatalf("a plain Nack delivered %s next, want 1-0 again", again.UUID)
	}
}
