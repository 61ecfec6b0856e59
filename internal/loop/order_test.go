package loop

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The loop's ordering rules, each checked against the fake server's log of
// calls: what the loop decides, without a server. What the server does with
// those calls is proven against real servers in the root package's tests.

// handled is the note a test's handler writes into the fake's log before it
// Acks a message.
const handled = "handled"

// acksBefore checks that every id the handler handled before a call whose
// log line starts with op was in an XACK before that call.
func acksBefore(t *testing.T, log []string, op string) (calls int) {
	t.Helper()
	done := map[string]bool{}
	sent := map[string]bool{}
	for i, line := range log {
		name, list, _ := strings.Cut(line, " ")
		switch name {
		case handled:
			done[list] = true
		case "ack":
			for _, id := range strings.Split(list, ",") {
				sent[id] = true
			}
		case op:
			calls++
			for id := range done {
				if !sent[id] {
					t.Fatalf("call %d (%q) came before the Ack of %s, handled earlier; log:\n%s", i, line, id, strings.Join(log, "\n"))
				}
			}
		}
	}
	return calls
}

// Rule: Acks are sent before a drain or a claim, so that neither reads an
// entry this loop has handled (a claim would take it back; a drain would
// deliver it again). Checked on the loop's fetch step itself: with Acks
// held, a fetch whose step is a claim, and one whose step is a drain (after
// a fault), each send the Acks first; a failed XACK stops the step.
func TestAcksAreSentBeforeADrainOrAClaim(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(l *Group)
		op    string
	}{
		{"claim", func(l *Group) { l.plan.drained("") }, "claim"},
		{"drain after a fault", func(l *Group) { l.plan.drained(""); l.plan.restart() }, "drain"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeServer(3)
			cfg := testConfig()
			cfg.ClaimInterval = time.Hour // the first beat is due at once
			l := newTestGroup(cfg, srv)
			srv.mu.Lock()
			srv.takeNew(3) // delivered to this consumer, and handled:
			srv.mu.Unlock()
			for _, id := range []string{"1-0", "2-0", "3-0"} {
				srv.note(handled, id)
				l.acks.add(id)
			}
			tt.setup(l)
			if got := l.plan.next(time.Now()); got != map[string]step{"claim": stepClaim, "drain": stepDrain}[tt.op] {
				t.Fatalf("the plan's next step is %d, not a %s: the test shows nothing", got, tt.op)
			}
			if err := l.fetch(context.Background()); err != nil {
				t.Fatal(err)
			}
			log := srv.calls()
			if n := acksBefore(t, log, tt.op); n != 1 {
				t.Fatalf("%d calls %q; want 1; log:\n%s", n, tt.op, strings.Join(log, "\n"))
			}

			// A failed XACK: the step waits (the fault drains, and Acks go first again).
			l.acks.add("4-0")
			srv.note(handled, "4-0")
			tt.setup(l)
			srv.failNext(errors.New("connection reset"))
			if err := l.fetch(context.Background()); err == nil {
				t.Fatal("a fetch whose Acks failed returned no error")
			}
			if log := srv.calls(); strings.HasPrefix(log[len(log)-1], tt.op) {
				t.Fatalf("the %s ran after its Acks failed; log:\n%s", tt.op, strings.Join(log, "\n"))
			}
		})
	}
}

// fakeWaiter is a shared reader that covers the stream: every new entry
// comes through Wait, a few at a time.
type fakeWaiter struct {
	srv  *fakeServer
	most int64
}

func (w *fakeWaiter) Covers() bool { return true }

func (w *fakeWaiter) Wait(ctx context.Context, count int64, d time.Duration) (Waited, error) {
	for {
		w.srv.mu.Lock()
		es := w.srv.takeNew(min(count, w.most))
		if len(es) > 0 {
			w.srv.record("wait", ids(es))
			w.srv.mu.Unlock()
			return Waited{Entries: es}, nil
		}
		w.srv.mu.Unlock()
		select {
		case <-w.srv.added:
		case <-ctx.Done():
			return Waited{}, nil
		}
	}
}

func (w *fakeWaiter) Leave() []string { return nil }

// Rule: no read of its own while a shared reader covers its stream: two
// reads of one stream in flight may reach the server in either order, and
// the later would bring the earlier entries. Acks go on their own.
func TestNoReadOfItsOwnWhileItsStreamIsCovered(t *testing.T) {
	srv := newFakeServer(6)
	out, cancel, done := run(t, testConfig(), srv, &fakeWaiter{srv: srv, most: 2})
	for range 6 {
		m := receive(t, out)
		m.Ack()
	}
	cancel()
	<-done
	log := srv.calls()
	waits := 0
	for _, line := range log {
		name, _, _ := strings.Cut(line, " ")
		switch name {
		case "read", "read-failed", "block":
			t.Fatalf("the loop read on its own while covered: %q; log:\n%s", line, strings.Join(log, "\n"))
		case "wait":
			waits++
		}
	}
	if waits != 3 {
		t.Fatalf("%d waits brought the entries, want 3; log:\n%s", waits, strings.Join(log, "\n"))
	}
}

// Rule: a Nacked entry comes back before newer entries, with its delivery
// count grown.
func TestANackComesBackBeforeNewerEntries(t *testing.T) {
	srv := newFakeServer(3)
	out, _, _ := run(t, testConfig(), srv, nil)
	var got []string
	nacked := false
	for len(got) < 4 {
		m := receive(t, out)
		got = append(got, m.UUID+"#"+m.Metadata.Get(MetadataDeliveryCount))
		if m.UUID == "1-0" && !nacked {
			nacked = true
			m.Nack()
			continue
		}
		m.Ack()
	}
	want := []string{"1-0#1", "1-0#2", "2-0#1", "3-0#1"}
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// Rule: reads sent ahead never break stream order: with a round trip that
// varies from nothing to several times what the handler takes per message,
// replies land while entries are still queued, or once the queue is empty;
// every entry is delivered once, in stream order.
func TestReadsSentAheadKeepStreamOrder(t *testing.T) {
	const n = 400
	srv := newFakeServer(n)
	srv.delay = func() time.Duration { return time.Duration(rand.IntN(1500)) * time.Microsecond }
	cfg := testConfig()
	cfg.BatchSize = 8
	out, _, _ := run(t, cfg, srv, nil)
	var got []string
	for len(got) < n {
		m := receive(t, out)
		got = append(got, m.UUID)
		time.Sleep(100 * time.Microsecond) // the handler's work
		m.Ack()
	}
	for i, id := range got {
		if want := srv.ids[i]; id != want {
			t.Fatalf("message %d is %s, want %s (stream order)", i, id, want)
		}
	}
	log := srv.calls()
	ahead := 0
	for _, line := range log {
		if strings.HasPrefix(line, "read-ahead ") {
			ahead++
		}
	}
	if ahead < n/int(cfg.BatchSize)/4 {
		t.Fatalf("%d reads sent ahead for %d entries in batches of %d: reads ahead did not run, and this test shows nothing; log:\n%s",
			ahead, n, cfg.BatchSize, strings.Join(log, "\n"))
	}
}

// Rule: Close sends the Acks not sent yet and hands back what no handler
// has (the queue, and the message offered to nobody), in its last round
// trip.
func TestCloseSendsPendingAcksAndHandsBackTheQueue(t *testing.T) {
	srv := newFakeServer(10)
	out, cancel, done := run(t, testConfig(), srv, nil)
	for range 3 {
		receive(t, out).Ack()
	}
	// The loop now offers 4-0; nobody takes it.
	cancel()
	<-done
	log := srv.calls()
	var acked []string
	for _, line := range log {
		if list, ok := strings.CutPrefix(line, "ack "); ok {
			acked = append(acked, strings.Split(list, ",")...)
		}
	}
	if want := []string{"1-0", "2-0", "3-0"}; !slices.Equal(acked, want) {
		t.Fatalf("acknowledged %v, want %v; log:\n%s", acked, want, strings.Join(log, "\n"))
	}
	if last, want := log[len(log)-1], "handback 4-0,5-0,6-0,7-0,8-0,9-0,10-0"; last != want {
		t.Fatalf("the last call was %q, want %q; log:\n%s", last, want, strings.Join(log, "\n"))
	}
}

// Rule: a hold beat that finds an entry taken over by another consumer
// does not deliver it: neither the one being handed over nor a queued one.
func TestAHoldThatFindsAnEntryTakenDoesNotDeliverIt(t *testing.T) {
	srv := newFakeServer(4)
	srv.take("1-0", "3-0") // by another consumer, once the loop holds them
	beat := make(chan struct{})
	srv.onHold = func(ids []string, counts []int64) {
		if len(ids) == 4 && counts[0] == 0 {
			close(beat)
		}
	}
	cfg := testConfig()
	cfg.ClaimMinIdle = 30 * time.Millisecond // a hold beat every 10 ms
	out, _, _ := run(t, cfg, srv, nil)
	select {
	case <-beat: // the beat that finds 1-0 and 3-0 taken, while 1-0 is offered
	case <-time.After(10 * time.Second):
		t.Fatal("no hold beat within 10 s")
	}
	var got []string
	for len(got) < 2 {
		m := receive(t, out)
		got = append(got, m.UUID)
		m.Ack()
	}
	if want := []string{"2-0", "4-0"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (1-0 and 3-0 belong to another consumer)", got, want)
	}
}

// parkingWaiter is a shared reader that read entries for the subscription
// while it did not wait, and then reported a failed read: it hands the
// parked entries out at the next wait, as the real one does.
type parkingWaiter struct {
	fakeWaiter
	parked []Entry
	failed bool
}

func (w *parkingWaiter) Wait(ctx context.Context, count int64, d time.Duration) (Waited, error) {
	if !w.failed {
		w.failed = true
		w.srv.mu.Lock()
		w.parked = w.srv.takeNew(count)
		w.srv.record("parked", ids(w.parked))
		w.srv.mu.Unlock()
		return Waited{}, errors.New("connection reset")
	}
	if es := w.parked; es != nil {
		w.parked = nil
		w.srv.note("wait-parked", strings.Join(ids(es), ","))
		return Waited{Entries: es, Since: time.Now()}, nil
	}
	return w.fakeWaiter.Wait(ctx, count, d)
}

// Rule: a fault never hands out the same entry twice: entries a shared
// read took before the fault are delivered by the drain that follows it,
// and their copies, handed out by the next wait, are not delivered again.
func TestAFaultNeverHandsOutAnEntryTwice(t *testing.T) {
	srv := newFakeServer(3)
	out, _, _ := run(t, testConfig(), srv, &parkingWaiter{fakeWaiter: fakeWaiter{srv: srv, most: 10}})
	var got []string
	for len(got) < 3 {
		m := receive(t, out)
		got = append(got, m.UUID+"#"+m.Metadata.Get(MetadataDeliveryCount))
		m.Ack()
	}
	srv.add(1)
	m := receive(t, out)
	got = append(got, m.UUID+"#"+m.Metadata.Get(MetadataDeliveryCount))
	m.Ack()
	want := []string{"1-0#2", "2-0#2", "3-0#2", "4-0#1"}
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (the drain delivers the parked entries once); log:\n%s", got, want, strings.Join(srv.calls(), "\n"))
	}
}

// Rule: an entry a shared read parked for the loop, which its own claim
// beat took and delivered while it waited parked (it was idle for
// ClaimMinIdle), is not delivered a second time from the parked copy: its
// count grew past the read's. One still at the read's count is delivered,
// and one a peer holds now is left to it.
func TestAParkedEntryClaimedSinceIsNotDeliveredTwice(t *testing.T) {
	srv := newFakeServer(0)
	srv.pending["1-0"] = 1 // still as the shared read delivered it
	srv.pending["2-0"] = 2 // the loop's own claim delivered it again
	srv.pending["3-0"] = 3 // a read that claimed it (count 2), then a claim
	srv.pending["4-0"] = 2 // claimed by the read, as it was read
	srv.pending["5-0"] = 2
	srv.take("5-0") // a peer's claim
	cfg := testConfig()
	l := newTestGroup(cfg, srv)
	read := time.Now().Add(-cfg.ClaimMinIdle)  // parked that long ago
	l.plan.drainBegan = read.Add(-time.Second) // and after the last drain began
	var parked []Entry
	for _, e := range []Entry{{ID: "1-0"}, {ID: "2-0"}, {ID: "3-0", Count: 2}, {ID: "4-0", Count: 2}, {ID: "5-0"}} {
		e.Fields = fakeEntry(e.ID).Fields
		parked = append(parked, e)
	}
	l.deps.Shared = &parkedWaiter{w: Waited{Entries: parked, Since: read}}
	if err := l.readShared(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range l.held.queue {
		got = append(got, fmt.Sprintf("%s:%d", e.id, e.count))
	}
	if want := []string{"1-0:1", "4-0:2"}; !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v; log:\n%s", got, want, strings.Join(srv.calls(), "\n"))
	}
	if r := l.deps.Counters.Reclaimed.Load(); r != 1 {
		t.Fatalf("Reclaimed = %d, want 1 (4-0, claimed by the read)", r)
	}
}
