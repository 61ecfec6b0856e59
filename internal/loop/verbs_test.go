package loop

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/serverinfo"
	"github.com/echomq/valkeystream/internal/testserver"
)

// verbsServer starts a server with a stream "s", group "g", and returns a
// client and the server's verbs.
func verbsServer(t *testing.T) (*redis.Client, serverinfo.Verbs) {
	t.Helper()
	testserver.Parallel(t)
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	if err := client.XGroupCreateMkStream(context.Background(), "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	v, _, err := serverinfo.Probe(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	return client, v
}

func addEntries(t *testing.T, client *redis.Client, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := client.XAdd(context.Background(), &redis.XAddArgs{Stream: "s", Values: []any{"n", i}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

func serverWith(client *redis.Client, v serverinfo.Verbs, consumer string, o RedisServerOptions) *RedisServer {
	o.Key, o.Group, o.Consumer = "s", "g", consumer
	if o.BlockTime == 0 {
		o.BlockTime = 50 * time.Millisecond
	}
	o.Verbs = func(context.Context) serverinfo.Verbs { return v }
	return NewRedisServer(client, o)
}

// On a server with XREADGROUP ... CLAIM, a read of new entries brings the
// idle entries of a dead consumer first, each with its delivery count after
// this delivery (the reply says the count before it: checked against
// XPENDING), then new entries with no count; both in a round trip (Send)
// and in a blocking read (Block). Without the verb, or without
// ClaimInReads, a read brings new entries only.
func TestReadsClaimIdleEntriesWhereTheServerCan(t *testing.T) {
	client, v := verbsServer(t)
	ctx := context.Background()
	if !v.ClaimInRead {
		// The baseline: a read never claims, whatever the options.
		addEntries(t, client, 2)
		if err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{"s", ">"}, Count: 2}).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond) // the time is the scenario: past ClaimMinIdle
		s := serverWith(client, v, "live", RedisServerOptions{ClaimMinIdle: 100 * time.Millisecond, ClaimInReads: true})
		r := s.Send(ctx, Trip{Reads: []int64{10}})
		if r.ReadErr != nil || len(r.Entries) != 0 {
			t.Fatalf("baseline read: %d entries, err %v: want none (this server has no CLAIM in reads: %s)", len(r.Entries), r.ReadErr, v)
		}
		return
	}
	const idle = 100 * time.Millisecond
	old := addEntries(t, client, 3)
	if err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{"s", ">"}, Count: 3}).Err(); err != nil {
		t.Fatal(err)
	}
	// Delivered twice before: the third delivery's count is 3.
	if err := client.XClaim(ctx, &redis.XClaimArgs{Stream: "s", Group: "g", Consumer: "dead", Messages: old[:1]}).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := addEntries(t, client, 2)
	time.Sleep(idle + 50*time.Millisecond) // the time is the scenario: past the min idle time

	off := serverWith(client, v, "live", RedisServerOptions{ClaimMinIdle: idle})
	if r := off.Send(ctx, Trip{Reads: []int64{1}}); r.ReadErr != nil || len(r.Entries) != 1 || r.Entries[0].ID != fresh[0] || r.Entries[0].Count != 0 {
		t.Fatalf("read without ClaimInReads: %+v, err %v: want the first new entry only", r.Entries, r.ReadErr)
	}

	s := serverWith(client, v, "live", RedisServerOptions{ClaimMinIdle: idle, ClaimInReads: true})
	r := s.Send(ctx, Trip{Reads: []int64{10}})
	if r.ReadErr != nil {
		t.Fatal(r.ReadErr)
	}
	got := map[string]int64{}
	for _, e := range r.Entries {
		got[e.ID] = e.Count
	}
	want := map[string]int64{old[0]: 3, old[1]: 2, old[2]: 2, fresh[1]: 0}
	if len(got) != len(want) {
		t.Fatalf("claiming read brought %v, want %v", got, want)
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("entry %s: count %d, want %d", id, got[id], n)
		}
	}
	pending, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: "s", Group: "g", Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pending {
		if n, claimed := want[p.ID]; claimed && n > 0 && (p.Consumer != "live" || p.RetryCount != n) {
			t.Errorf("XPENDING of claimed %s: consumer %s count %d, want live with %d (the count the read reported, plus this delivery)", p.ID, p.Consumer, p.RetryCount, n)
		}
	}

	// A blocking read claims too (what live holds is acknowledged first, or
	// it would be idle enough to claim again).
	done := []string{fresh[0]}
	for id := range got {
		done = append(done, id)
	}
	if r := s.Send(ctx, Trip{Acks: done}); r.AckErr != nil || r.Acked != int64(len(done)) {
		t.Fatalf("Ack: %d, %v", r.Acked, r.AckErr)
	}
	more := addEntries(t, client, 1)
	if err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{"s", ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idle + 50*time.Millisecond) // the time is the scenario: past the min idle time
	es, err := s.Block(ctx, 10, 50*time.Millisecond)
	if err != nil || len(es) != 1 || es[0].ID != more[0] || es[0].Count != 2 {
		t.Fatalf("blocking claiming read: %+v, err %v: want %s with count 2", es, err, more[0])
	}
	s.Interrupt()
	off.Interrupt()
}

// With DeleteAcked, on a server with XACKDEL, an Ack deletes the entry
// once every group has acknowledged it, and counts what it acknowledged as
// XACK does; without the verb it is a plain XACK.
func TestDeleteAckedDeletesWhatEveryGroupAcknowledged(t *testing.T) {
	client, v := verbsServer(t)
	ctx := context.Background()
	if err := client.XGroupCreate(ctx, "s", "other", "0").Err(); err != nil {
		t.Fatal(err)
	}
	ids := addEntries(t, client, 3)
	for _, g := range []string{"g", "other"} {
		if err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "c", Streams: []string{"s", ">"}, Count: 3}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := serverWith(client, v, "c", RedisServerOptions{ClaimMinIdle: time.Second, DeleteAcked: true})
	defer s.Interrupt()
	// "other" acknowledged the first entry only.
	if err := client.XAckDel(ctx, "s", "other", "ACKED", ids[0]).Err(); err != nil && v.AckDel {
		t.Fatal(err)
	} else if !v.AckDel {
		if err := client.XAck(ctx, "s", "other", ids[0]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r := s.Send(ctx, Trip{Acks: append(ids[:2:2], "1-1")})
	if r.AckErr != nil || r.Acked != 2 {
		t.Fatalf("Ack: acked %d, err %v: want 2 (the unknown id counts nothing)", r.Acked, r.AckErr)
	}
	left, err := client.XRange(ctx, "s", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	wantLeft := 3
	if v.AckDel {
		wantLeft = 2 // the first is acknowledged by both groups: deleted
	}
	if len(left) != wantLeft {
		t.Fatalf("%d entries left (verbs %s), want %d", len(left), v, wantLeft)
	}
	if v.AckDel && (left[0].ID != ids[1] || left[1].ID != ids[2]) {
		t.Fatalf("left %v, want %s and %s (still pending for other)", left, ids[1], ids[2])
	}
}

// An entry a read claimed is delivered with the count the read reported
// and counted as reclaimed, even when its id is below what the drain
// delivered (the drain cannot have delivered an entry that was idle); a
// new entry below it is one the drain delivered, and is dropped.
func TestClaimedEntriesOfAReadKeepTheirCounts(t *testing.T) {
	l := newTestGroup(testConfig(), newFakeServer(0))
	l.plan.drained("5-0")
	l.plan.drained("")
	n := l.enqueueNew([]Entry{{ID: "3-0", Count: 4}, {ID: "4-0"}, {ID: "6-0"}})
	if n != 3 {
		t.Fatalf("enqueueNew = %d, want 3 read", n)
	}
	var got []string
	for _, e := range l.held.queue {
		got = append(got, fmt.Sprintf("%s:%d", e.id, e.count))
	}
	if want := []string{"3-0:4", "6-0:1"}; !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if r := l.deps.Counters.Reclaimed.Load(); r != 1 {
		t.Fatalf("Reclaimed = %d, want 1", r)
	}
}

// parkedWaiter hands out one Waited.
type parkedWaiter struct{ w Waited }

func (p *parkedWaiter) Covers() bool { return true }
func (p *parkedWaiter) Wait(context.Context, int64, time.Duration) (Waited, error) {
	w := p.w
	p.w = Waited{}
	return w, nil
}
func (p *parkedWaiter) Leave() []string { return nil }

// Entries a shared read took while the loop did not wait, by a read sent
// before the loop's last drain began: a new one the drain reached (its id
// at most the drain's last) was delivered by it and is dropped; a claimed
// one is dropped when the server's count grew past the claim's (the drain
// delivered it), kept when it is still the claim's (claimed after the
// drain read that far, as a blocked read claims when it is woken: dropping
// it would strand it, its count grown). Parked by a read sent after the
// drain began, a claimed entry is kept whatever its id.
func TestParkedClaimsOfAReadBeforeADrainAreNotDeliveredTwice(t *testing.T) {
	for _, before := range []bool{true, false} {
		srv := newFakeServer(0)
		srv.pending["3-0"] = 3 // claimed (2), then delivered by the drain
		srv.pending["1-0"] = 2 // claimed after the drain read past it
		srv.pending["7-0"] = 2
		l := newTestGroup(testConfig(), srv)
		sent := l.plan.drainBegan.Add(time.Millisecond)
		if before {
			sent = l.plan.drainBegan.Add(-time.Millisecond)
		}
		l.plan.drained("5-0")
		l.plan.drained("")
		l.deps.Shared = &parkedWaiter{w: Waited{Entries: []Entry{{ID: "1-0", Count: 2}, {ID: "3-0", Count: 2}, {ID: "4-0"}, {ID: "7-0", Count: 2}, {ID: "8-0"}}, Since: sent}}
		if err := l.readShared(context.Background()); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range l.held.queue {
			got = append(got, fmt.Sprintf("%s:%d", e.id, e.count))
		}
		want := []string{"1-0:2", "7-0:2", "8-0:1"}
		if !before {
			want = []string{"1-0:2", "3-0:2", "7-0:2", "8-0:1"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("read sent before the drain %v: queued %v, want %v", before, got, want)
		}
	}
}
