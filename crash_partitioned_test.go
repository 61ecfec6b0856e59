package valkeystream_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/partition"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The partitioned crash audit: the per-key order of a partitioned topic
// under kill -9. Keyed messages, numbered 0, 1, 2, ... within each key and
// published in rounds across the keys (round n publishes every key's
// message n), go to a topic of Partitions partitions while worker
// processes (internal/crashworker -partitions) consume them through one
// consumer group, each handling taking HandleTime, and are killed with
// SIGKILL at random moments and restarted, under their name or a new one.
// A few handlings ask for a retry (valkeystream.NackAfter) instead of
// finishing: on a partitioned topic that must be a plain Nack whose message
// comes back before the key's next one.
//
// Every ledger line of the workers is keyed (audit.Writer.Keyed): key,
// sequence number and the wall clock of the write. At the end the audit
// asks the server (every partition stream's group: nothing pending, every
// entry delivered, lag 0) and the ledgers:
//   - lost: a published message with no H line in any ledger;
//   - out of order: per key, the messages ordered by their first handling
//     (the earliest B line of the message in any ledger; the same for the
//     earliest H line) must come in sequence order; a message whose first
//     handling came after that of a later message of its key counts once;
//   - handled again: messages with more than one H line, the price of
//     at-least-once after a kill between a handling and its Ack;
//   - overlaps: two handlings of one partition in different processes
//     whose intervals (B to H, R or the process's death) intersect: one
//     in flight per partition within the group; a handling that a freeze
//     of its process interrupted is left out (the limit of fencing: a
//     message in a handler's hands cannot be recalled);
//   - handled after a move: a handling of an entry that began after a
//     handling of the same entry with a delivery count as high or higher.
//     Every delivery of an entry grows its count (the new owner's read of
//     what it took over included), so a handling whose count went
//     backwards is of a delivery that was another's by then: a stale
//     owner's, which fencing forbids.
//
// Freezes (Freezes) stop a worker that owns partitions with SIGSTOP for
// longer than PartitionOwnerTTL plus a beat, so that the others take its
// partitions over, then resume it with SIGCONT. The worker checks each
// message's context before its ledger line (as docs/partitions.md tells
// handlers to), and the resumed worker must begin no handling of what it
// lost: a send armed before the freeze completes on the thaw, and the
// message's ended context is all that stops it.
//
// Ordering across processes by wall clock is sound here: within a process
// the lines are in write order, which time.Now (CLOCK_REALTIME, one clock
// for every process of the machine) follows unless the clock is stepped
// during the run (the audit counts steps backwards in each ledger and logs
// them). Between processes, a partition, and so every message of a key, is
// handled by one process at a time, and a new owner acquires it only once
// the old owner's record has lapsed on the server (PartitionOwnerTTL after
// its last renewal) or was released: the old owner was dead by then (here
// every hand-over after a kill follows a SIGKILL the test waited out), or,
// were it alive and cut off, fenced from reading another entry of the
// partition. So the first handlings of one key in two processes are
// separated by the takeover gap, hundreds of milliseconds, against a
// clock read that takes nanoseconds.
//
// The takeover gaps: for every kill, the partitions the victim owned (its
// owner records, read after its death) and, for each, the time from the
// kill to the next B line of that partition in any ledger.

// crashPartitionedParams sizes one partitioned crash audit.
type crashPartitionedParams struct {
	Partitions int
	Workers    int              // worker processes alive at once
	Keys       int              // partition keys
	PerKey     int              // messages per key, numbered 0..PerKey-1
	Kills      int              // SIGKILLs, then the run drains
	KillEvery  [2]time.Duration // pause before each kill, uniform in [0]..[1]
	PublishFor time.Duration    // the rounds are spread over about this long
	HandleTime time.Duration    // every handling takes this long
	OwnerTTL   time.Duration    // PartitionOwnerTTL of the workers
	RetryProb  float64          // probability that a handling asks for a retry
	Freezes    int              // SIGSTOPs, among the kills (after the same pause)
	FreezeFor  [2]time.Duration // how long each holds, uniform; zero: OwnerTTL plus 0.6 s to 1.2 s
}

// crashPartitionedCI is the size of the audit in the normal test run.
var crashPartitionedCI = crashPartitionedParams{
	Partitions: 8,
	Workers:    3,
	Keys:       100,
	PerKey:     40,
	Kills:      5,
	KillEvery:  [2]time.Duration{700 * time.Millisecond, 1500 * time.Millisecond},
	PublishFor: 7 * time.Second,
	HandleTime: time.Millisecond,
	OwnerTTL:   time.Second,
	RetryProb:  0.02,
}

// crashPartitionedFreezesCI is the size of the freeze audit in the normal
// test run: handlings of 3 ms and a publish rate near what three workers
// handle, so that a worker's partitions have messages waiting (offers
// armed) when it is frozen.
var crashPartitionedFreezesCI = crashPartitionedParams{
	Partitions: 8,
	Workers:    3,
	Keys:       100,
	PerKey:     50,
	Kills:      1,
	Freezes:    5,
	KillEvery:  [2]time.Duration{500 * time.Millisecond, 900 * time.Millisecond},
	PublishFor: 11 * time.Second,
	HandleTime: 3 * time.Millisecond,
	OwnerTTL:   time.Second,
}

// TestCrashAuditPartitionedFreezes freezes consumers of a partitioned topic
// past their ownership (5 freezes, 1 kill): nothing lost, order kept, and
// no handling by a thawed worker of a partition it lost. The full size is
// TestCrashAuditPartitionedFreezesStress (go test -tags stress).
func TestCrashAuditPartitionedFreezes(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	if !crashCanFreeze {
		t.Skip("no SIGSTOP on this system")
	}
	runCrashPartitioned(t, crashPartitionedFreezesCI)
}

// TestCrashAuditPartitioned kills the consumers of a partitioned topic
// (8 partitions, 3 worker processes, 100 keys of 40 numbered messages, a
// handling of 1 ms, 5 kills): no message lost, no key's message handled
// for the first time before an earlier one of its key, no two handlings of
// one partition at once. The full size is TestCrashAuditPartitionedStress
// (go test -tags stress).
func TestCrashAuditPartitioned(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	runCrashPartitioned(t, crashPartitionedCI)
}

// crashPartitionedResult is what a partitioned audit found.
type crashPartitionedResult struct {
	messages      int
	kills         int
	lost          int // published, never handled (no H line)
	outOfOrderB   int // messages whose first B line came after one of a later message of their key
	outOfOrderH   int // the same by first H lines
	handledAgain  int // messages with more than one H line
	extraHandled  int // H lines beyond the first of a message
	begunAgain    int // messages with more than one B line (retries included)
	retried       int // R lines
	overlaps      int // pairs of intersecting handlings of one partition in two processes
	frozenInHand  int // handlings a freeze of their process interrupted (left out of overlaps)
	afterMove     int // handlings of an entry begun after one of it with as high a delivery count
	freezes       int
	lateHandOvers int // messages the workers took with their context ended (PartitionStats.LateHandOvers)
	clockSteps    int // ledger lines stamped earlier than the line before in their ledger
	maxDC         int
	gaps          []time.Duration // kill to the next handling of each partition the victim owned
	killsOwning   int             // kills whose victim owned partitions
	killsPending  int             // kills whose victim had entries pending (read, or handled and not yet acknowledged)
	pendingAtKill int             // those entries
	mismatches    int             // ledger lines whose key or seq is not the published one of their UUID
	serverPending int64
}

// seenRecord is an owner record of a partition.
type seenRecord struct {
	partition int
	record    string
}

// crashKeyed is a published message of the partitioned audit.
type crashKeyed struct {
	key string
	seq int
}

// crashPartitionedKill is one kill: when the victim was gone, and which
// partitions it owned then (by owner records naming it and not seen at an
// earlier kill).
type crashPartitionedKill struct {
	w       *crashWorker
	at      time.Time
	owned   []int
	pending int // entries pending to the victim in the partitions' groups
}

// crashPartitionedFreeze is one freeze: the worker, and when it was
// stopped and resumed.
type crashPartitionedFreeze struct {
	w        *crashWorker
	from, to int64 // Unix nanoseconds
	owned    int   // partitions it owned when stopped
}

type crashPartitioned struct {
	crashRig
	p      crashPartitionedParams
	layout *partition.Layout

	recs    map[*crashWorker][]audit.Record
	kills   []crashPartitionedKill
	freezes []crashPartitionedFreeze
	// seenRecords are the owner records read at the kills (an epoch
	// counts the acquisitions of one partition: the same record may name
	// two partitions).
	seenRecords map[seenRecord]bool
	start       time.Time // when the first worker started
}

func runCrashPartitioned(t *testing.T, p crashPartitionedParams) crashPartitionedResult {
	start := time.Now()
	topic := "crash-partitioned-" + watermill.NewShortUUID()
	layout, err := partition.NewLayout(topic, p.Partitions)
	require.NoError(t, err)
	a := &crashPartitioned{
		crashRig: newCrashRig(t, "partitioned crash audit", topic, 0x9a27),
		p:        p,
		layout:   layout,
		recs:     map[*crashWorker][]audit.Record{},

		seenRecords: map[seenRecord]bool{},
	}
	srv, seed := a.srv, a.seed
	t.Cleanup(a.killAll)

	a.start = time.Now()
	slots := make([]*crashWorker, p.Workers)
	for i := range slots {
		slots[i] = a.spawn(fmt.Sprintf("w%d-0", i))
	}
	// The workers subscribe first (StartHead: they would read the streams
	// from the beginning anyway), so that the kills land on a busy group.
	published := make(chan crashPartitionedPublished, 1)
	var publishedSoFar atomic.Int64
	go func() { published <- a.publish(&publishedSoFar) }()

	var sameName, abandoned int
	var lastKill time.Time
	// Which rounds freeze instead of kill: drawn at the start.
	freezeRound := map[int]bool{}
	for _, r := range a.rng.Perm(p.Kills + p.Freezes)[:p.Freezes] {
		freezeRound[r] = true
	}
	for k := 0; k < p.Kills+p.Freezes; k++ {
		a.sleepRandom(p.KillEvery[0], p.KillEvery[1])
		for _, w := range slots {
			if w.exited() {
				t.Fatalf("worker %s (run %d) exited by itself: %v\n%s", w.name, w.gen, w.waitErr, crashLogTail(w.logPath))
			}
		}
		// Three kills in four hit a worker that owns partitions now (a
		// worker just restarted owns none for about PartitionOwnerTTL),
		// the others any worker, maybe one that is still joining.
		slot := a.rng.IntN(len(slots))
		if a.rng.IntN(4) > 0 {
			var owning []int
			records := a.ownerRecords()
			for i, w := range slots {
				for p, record := range records {
					if a.owns(w, p, record) {
						owning = append(owning, i)
						break
					}
				}
			}
			if len(owning) > 0 {
				slot = owning[a.rng.IntN(len(owning))]
			}
		}
		victim := slots[slot]
		if freezeRound[k] {
			a.freeze(victim)
			lastKill = time.Now()
			continue
		}
		a.kill(victim)
		lastKill = time.Now()
		name := victim.name
		if a.rng.IntN(2) == 0 {
			sameName++
		} else {
			// The old name is never used again: its member entry lapses,
			// and its partitions go to the others.
			abandoned++
			name = fmt.Sprintf("w%d-%d", slot, a.spawns)
		}
		a.sleepRandom(0, 300*time.Millisecond)
		slots[slot] = a.spawn(name)
	}
	pub := <-published
	require.NoError(t, pub.err, "publishing")
	if publishedSoFar.Load() < int64(len(pub.msgs)) {
		t.Fatalf("published %d of %d", publishedSoFar.Load(), len(pub.msgs))
	}

	// Wait until every published message has an H line and every
	// partition's group has nothing pending and nothing unread.
	handledSet := map[string]bool{}
	var missing int
	for deadline := time.Now().Add(90 * time.Second); ; {
		a.readLedgers()
		for _, recs := range a.recs {
			for _, r := range recs {
				if r.Kind == audit.Handled {
					handledSet[r.UUID] = true
				}
			}
		}
		missing = len(pub.msgs) - len(handledSet)
		if missing == 0 && a.settled(false) {
			break
		}
		for _, w := range slots {
			if w.exited() {
				t.Fatalf("worker %s (run %d) exited by itself: %v\n%s", w.name, w.gen, w.waitErr, crashLogTail(w.logPath))
			}
		}
		if time.Now().After(deadline) {
			a.settled(true)
			t.Fatalf("not drained 90 s after publishing ended: %d of %d messages never handled (seed %d)", missing, len(pub.msgs), seed)
		}
		time.Sleep(50 * time.Millisecond) // the poll of a wait for the drain
	}
	drained := time.Since(lastKill)
	for _, w := range slots {
		a.stop(w)
	}
	late := a.lateHandOvers()
	a.readLedgers()
	require.True(t, a.settled(true), "the partitions' groups after the last workers stopped")

	r := a.judge(pub)
	r.kills = len(a.kills)
	r.freezes = len(a.freezes)
	r.lateHandOvers = late
	derived := 0 // runs whose lease gave another name than -consumer
	for _, w := range a.all {
		if m := a.member(w); m != "" && m != w.name {
			derived++
		}
	}
	t.Logf("partitioned crash audit on %s %s: %d partitions, %d workers at a time, %d keys x %d messages = %d messages, handling %s, PartitionOwnerTTL %s, retry probability %.2f",
		srv.Name(), srv.Version(), p.Partitions, p.Workers, p.Keys, p.PerKey, r.messages, p.HandleTime, p.OwnerTTL, p.RetryProb)
	t.Logf("kills: %d (SIGKILL), %d restarts under the same name (%d runs subscribed under a name derived from theirs, the killed run's lease not lapsed yet), %d names abandoned, %d processes started; %d kills hit a worker that owned partitions, %d one with entries pending to it (%d entries, handed over to the next owners)",
		r.kills, sameName, derived, abandoned, a.spawns, r.killsOwning, r.killsPending, r.pendingAtKill)
	t.Logf("outcome: %d lost, %d out of order by first handling began (%d by first handling finished), %d handled more than once (%d extra handlings), %d begun more than once, %d retries asked for, max delivery count %d, %d overlapping handlings of a partition, %d clock steps backwards in a ledger",
		r.lost, r.outOfOrderB, r.outOfOrderH, r.handledAgain, r.extraHandled, r.begunAgain, r.retried, r.maxDC, r.overlaps, r.clockSteps)
	t.Logf("freezes: %d (SIGSTOP past PartitionOwnerTTL, then SIGCONT); %d handlings interrupted by a freeze (handled again by the new owner: the limit); %d messages taken with their context ended (late hand-overs, not handled); %d handlings after a move",
		r.freezes, r.frozenInHand, r.lateHandOvers, r.afterMove)
	t.Logf("takeover gaps (kill to the next handling of each partition the victim owned, %d partitions): %s; last kill to drained %s; wall time %s",
		len(r.gaps), crashGapSummary(r.gaps), drained.Round(time.Millisecond), time.Since(start).Round(100*time.Millisecond))

	if r.lost > 0 || r.mismatches > 0 {
		t.Errorf("%d messages lost, %d ledger lines with another key or sequence number than published (seed %d)", r.lost, r.mismatches, seed)
	}
	if r.outOfOrderB > 0 || r.outOfOrderH > 0 {
		t.Errorf("per-key order broken: %d messages first handled (began) after a later message of their key, %d by the first finished handling (seed %d)",
			r.outOfOrderB, r.outOfOrderH, seed)
	}
	if r.overlaps > 0 {
		t.Errorf("%d pairs of handlings of one partition in two processes at once (seed %d)", r.overlaps, seed)
	}
	if r.afterMove > 0 {
		t.Errorf("%d handlings of an entry by a worker that had lost it: begun after a handling of the same entry with as high a delivery count (seed %d)", r.afterMove, seed)
	}
	return r
}

type crashPartitionedPublished struct {
	msgs     map[string]crashKeyed // uuid -> key and seq
	failures int
	err      error
}

// publish publishes p.PerKey rounds, round n every key's message n, in
// calls of up to 50 messages, spread over p.PublishFor.
func (a *crashPartitioned) publish(count *atomic.Int64) crashPartitionedPublished {
	client := redis.NewClient(&redis.Options{Addr: a.srv.Addr()})
	defer client.Close()
	res := crashPartitionedPublished{msgs: map[string]crashKeyed{}}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: client, Partitions: map[string]int{a.topic: a.p.Partitions},
	}, testLogger())
	if err != nil {
		res.err = err
		return res
	}
	const batch = 50
	start := time.Now()
	for seq := 0; seq < a.p.PerKey; seq++ {
		if d := time.Until(start.Add(a.p.PublishFor * time.Duration(seq) / time.Duration(a.p.PerKey))); d > 0 {
			time.Sleep(d) // the time is the scenario: the publish pace
		}
		for from := 0; from < a.p.Keys; from += batch {
			var msgs []*message.Message
			for k := from; k < min(from+batch, a.p.Keys); k++ {
				m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("k%d/%d", k, seq)))
				m.Metadata.Set(valkeystream.MetadataPartitionKey, fmt.Sprintf("k%d", k))
				m.Metadata.Set("seq", strconv.Itoa(seq))
				msgs = append(msgs, m)
			}
			// A failed call is retried before the next round: a message
			// written twice comes twice, in order.
			if err := publishRetrying(pub, a.topic, msgs, &res.failures); err != nil {
				res.err = fmt.Errorf("publish of round %d %w", seq, err)
				return res
			}
			for _, m := range msgs {
				res.msgs[m.UUID] = crashKeyed{key: m.Metadata.Get(valkeystream.MetadataPartitionKey), seq: seq}
			}
			count.Add(int64(len(msgs)))
		}
	}
	return res
}

// spawn starts a worker process under the consumer name.
func (a *crashPartitioned) spawn(name string) *crashWorker {
	a.t.Helper()
	w, args := a.newWorker(name)
	a.startWorker(w, append(args,
		"-delay-prob", "0",
		"-handle-time", a.p.HandleTime.String(),
		"-retry-prob", strconv.FormatFloat(a.p.RetryProb, 'g', -1, 64),
		"-retry-after", "50ms",
		"-partitions", strconv.Itoa(a.p.Partitions),
		"-partition-ttl", a.p.OwnerTTL.String(),
	))
	return w
}

// kill sends SIGKILL to the worker, waits until it is gone, and notes the
// partitions it owned: their owner records, which outlive it until they
// lapse, name it.
func (a *crashPartitioned) kill(w *crashWorker) {
	t := a.t
	t.Helper()
	require.NoError(t, w.cmd.Process.Kill())
	<-w.done
	at := time.Now()
	w.killed = true
	_ = w.stdin.Close()
	k := crashPartitionedKill{w: w, at: at}
	for i, record := range a.ownerRecords() {
		if a.owns(w, i, record) {
			k.owned = append(k.owned, i)
			a.seenRecords[seenRecord{i, record}] = true
		}
	}
	consumer := a.member(w)
	for _, stream := range a.layout.Streams() {
		if consumer == "" {
			break // killed before it subscribed
		}
		pend, err := a.admin.XPendingExt(context.Background(), &redis.XPendingExtArgs{
			Stream: stream, Group: a.group, Consumer: consumer, Start: "-", End: "+", Count: 1 << 20,
		}).Result()
		require.NoError(t, err)
		k.pending += len(pend)
	}
	a.kills = append(a.kills, k)
}

// freeze stops the worker with SIGSTOP for FreezeFor, then resumes it
// with SIGCONT.
func (a *crashPartitioned) freeze(w *crashWorker) {
	t := a.t
	t.Helper()
	hold := a.p.FreezeFor
	if hold == [2]time.Duration{} {
		hold = [2]time.Duration{a.p.OwnerTTL + 600*time.Millisecond, a.p.OwnerTTL + 1200*time.Millisecond}
	}
	f := crashPartitionedFreeze{w: w}
	require.NoError(t, crashStop(w.cmd.Process))
	f.from = time.Now().UnixNano()
	for i, record := range a.ownerRecords() {
		if a.owns(w, i, record) {
			f.owned++
		}
	}
	a.sleepRandom(hold[0], hold[1]) // the freeze is the scenario: it must outlast the ownership
	f.to = time.Now().UnixNano()
	require.NoError(t, crashCont(w.cmd.Process))
	a.freezes = append(a.freezes, f)
}

// lateHandOvers adds up the LateHandOvers the workers that stopped
// gracefully logged.
func (a *crashPartitioned) lateHandOvers() int {
	n := 0
	for _, w := range a.all {
		data, err := os.ReadFile(w.logPath)
		require.NoError(a.t, err)
		if _, after, ok := strings.Cut(string(data), "LateHandOvers:"); ok {
			v, _, _ := strings.Cut(after, "}")
			k, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(a.t, err, "LateHandOvers in %s", w.logPath)
			n += k
		}
	}
	return n
}

// member returns the consumer name of the worker's subscription (on a
// partitioned topic, its member id), which the worker logs once it has
// subscribed: -consumer, or a name derived from it (-consumer-2, ...) while
// an earlier run's lease on it has not lapsed; "" before.
func (r *crashRig) member(w *crashWorker) string {
	if w.member == "" {
		data, err := os.ReadFile(w.logPath)
		require.NoError(r.t, err)
		const prefix = "crashworker: subscribed as consumer "
		if _, after, ok := strings.Cut(string(data), prefix); ok {
			if name, _, ok := strings.Cut(after, "\n"); ok {
				w.member = name
			}
		}
	}
	return w.member
}

// owns reports whether the owner record ("<member>:<epoch>") of partition
// p is of the worker's subscription. A worker that has not logged its member id yet
// may hold its consumer name or one the lease derived from it (name-2,
// name-3, ...). A record an earlier kill already saw is of an earlier run
// under the same name whose record has not lapsed yet: it is not this
// run's, and its takeover counts from that kill.
func (a *crashPartitioned) owns(w *crashWorker, p int, record string) bool {
	if record == "" || a.seenRecords[seenRecord{p, record}] {
		return false
	}
	member, _, _ := strings.Cut(record, ":")
	if m := a.member(w); m != "" {
		return member == m
	}
	suffix, ok := strings.CutPrefix(member, w.name+"-")
	_, err := strconv.Atoi(suffix)
	return member == w.name || (ok && err == nil)
}

// ownerRecords returns each partition's owner record, "<member>:<epoch>"
// ("" for none).
func (a *crashPartitioned) ownerRecords() []string {
	records := make([]string, a.p.Partitions)
	for i := range records {
		record, err := a.admin.Get(context.Background(), a.layout.Keys(i, a.group).Owner).Result()
		if err == redis.Nil {
			continue
		}
		require.NoError(a.t, err)
		records[i] = record
	}
	return records
}

func (a *crashPartitioned) readLedgers() {
	for _, w := range a.all {
		recs, err := w.ledger.Read()
		require.NoError(a.t, err)
		for _, r := range recs {
			require.True(a.t, r.Keyed, "ledger line of worker %s (run %d) is not keyed: %+v", w.name, w.gen, r)
		}
		a.recs[w] = append(a.recs[w], recs...)
	}
}

// settled reports whether every partition stream's group has nothing
// pending and every entry delivered (last-delivered-id the stream's last
// id, lag 0); with explain it logs what is not.
func (a *crashPartitioned) settled(explain bool) bool {
	ctx := context.Background()
	ok := true
	for i, stream := range a.layout.Streams() {
		info, err := a.admin.XInfoStream(ctx, stream).Result()
		require.NoError(a.t, err, "stream %s", stream)
		groups, err := a.admin.XInfoGroups(ctx, stream).Result()
		require.NoError(a.t, err)
		var g *redis.XInfoGroup
		for j := range groups {
			if groups[j].Name == a.group {
				g = &groups[j]
			}
		}
		require.NotNil(a.t, g, "group %q of %s", a.group, stream)
		if g.Pending != 0 || g.LastDeliveredID != info.LastGeneratedID || g.Lag > 0 {
			ok = false
			if explain {
				a.t.Logf("partition %d (%s): %d entries, last %s; group: %d pending, last delivered %s, lag %d",
					i, stream, info.Length, info.LastGeneratedID, g.Pending, g.LastDeliveredID, g.Lag)
			}
		}
	}
	if !ok && explain {
		a.t.Logf("owner records now: %q", a.ownerRecords())
	}
	return ok
}

// crashHandling is a handling of a message in one process: from its B
// line to the line that ended it (H or R), or to the process's death.
type crashHandling struct {
	w          *crashWorker
	part       int
	begin, end int64
	frozen     bool // it met a freeze of its process
}

// judge reads the ledgers against what was published.
func (a *crashPartitioned) judge(pub crashPartitionedPublished) crashPartitionedResult {
	r := crashPartitionedResult{messages: len(pub.msgs)}
	type firsts struct{ b, h int64 }
	first := map[string]*firsts{}
	began, handled := map[string]int{}, map[string]int{}
	var handlings []crashHandling
	deathOf := map[*crashWorker]int64{}
	for _, k := range a.kills {
		deathOf[k.w] = k.at.UnixNano()
	}
	for _, w := range a.all {
		var open *crashHandling
		var last int64
		for _, rec := range a.recs[w] {
			if rec.At < last {
				r.clockSteps++
			}
			last = max(last, rec.At)
			want, ok := pub.msgs[rec.UUID]
			if !ok || want.key != rec.Key || want.seq != rec.Seq {
				r.mismatches++
				continue
			}
			f := first[rec.UUID]
			if f == nil {
				f = &firsts{}
				first[rec.UUID] = f
			}
			r.maxDC = max(r.maxDC, rec.Count)
			switch rec.Kind {
			case audit.Began:
				began[rec.UUID]++
				if f.b == 0 || rec.At < f.b {
					f.b = rec.At
				}
				if open != nil { // cannot be: one handling at a time in a worker
					handlings = append(handlings, *open)
				}
				open = &crashHandling{w: w, part: valkeystream.PartitionOf(rec.Key, a.p.Partitions), begin: rec.At, end: rec.At}
			case audit.Handled, audit.Retried:
				if rec.Kind == audit.Handled {
					handled[rec.UUID]++
					if f.h == 0 || rec.At < f.h {
						f.h = rec.At
					}
				} else {
					r.retried++
				}
				if open != nil {
					open.end = rec.At
					handlings = append(handlings, *open)
					open = nil
				}
			}
		}
		if open != nil {
			// Killed inside the handling (or stopped after a B line, which
			// a graceful stop does not do): it ran until the death.
			if d, ok := deathOf[w]; ok {
				open.end = d
			}
			handlings = append(handlings, *open)
		}
	}

	byKey := map[string][]string{} // key -> uuids
	for id, m := range pub.msgs {
		byKey[m.key] = append(byKey[m.key], id)
		switch n := handled[id]; {
		case n == 0:
			r.lost++
		case n > 1:
			r.handledAgain++
			r.extraHandled += n - 1
		}
		if began[id] > 1 {
			r.begunAgain++
		}
	}
	// overtaken counts the messages of a key whose first handling (by at)
	// came after that of a message with a higher sequence number.
	overtaken := func(ids []string, at func(id string) int64) (n int, example string) {
		ids = slices.Clone(ids)
		ids = slices.DeleteFunc(ids, func(id string) bool { return at(id) == 0 })
		sort.Slice(ids, func(i, j int) bool { return at(ids[i]) < at(ids[j]) })
		highest, highestID := -1, ""
		for _, id := range ids {
			seq := pub.msgs[id].seq
			if seq < highest {
				n++
				if example == "" {
					example = fmt.Sprintf("key %s: message %d (%s) first handled %s after message %d (%s)",
						pub.msgs[id].key, seq, id, time.Duration(at(id)-at(highestID)), highest, highestID)
				}
			}
			if seq > highest {
				highest, highestID = seq, id
			}
		}
		return n, example
	}
	var examples []string
	for _, ids := range byKey {
		n, ex := overtaken(ids, func(id string) int64 {
			if f := first[id]; f != nil {
				return f.b
			}
			return 0
		})
		r.outOfOrderB += n
		if ex != "" && len(examples) < 5 {
			examples = append(examples, "began: "+ex)
		}
		n, ex = overtaken(ids, func(id string) int64 {
			if f := first[id]; f != nil {
				return f.h
			}
			return 0
		})
		r.outOfOrderH += n
		if ex != "" && len(examples) < 5 {
			examples = append(examples, "finished: "+ex)
		}
	}
	for _, ex := range examples {
		a.t.Log("out of order: " + ex)
	}

	// One handling per partition at a time: intervals of one partition in
	// two processes must not intersect.
	byPart := make([][]crashHandling, a.p.Partitions)
	for i, h := range handlings {
		for _, f := range a.freezes {
			// from is read once the signal is sent, and the process may
			// still write a line before it stops: a handling counts as
			// interrupted when it meets the freeze at all.
			if f.w == h.w && h.begin < f.to && h.end > f.from {
				handlings[i].frozen = true
				r.frozenInHand++
				break
			}
		}
		byPart[h.part] = append(byPart[h.part], handlings[i])
	}
	r.afterMove = a.afterMove()
	for p, hs := range byPart {
		sort.Slice(hs, func(i, j int) bool { return hs[i].begin < hs[j].begin })
		var reach crashHandling // the handling reaching furthest so far
		for i, h := range hs {
			if h.frozen {
				continue
			}
			if i > 0 && h.begin < reach.end && h.w != reach.w {
				r.overlaps++
				if r.overlaps <= 3 {
					a.t.Logf("overlap in partition %d: %s (run %d) handled from %d to %d, %s (run %d) began at %d",
						p, reach.w.name, reach.w.gen, reach.begin, reach.end, h.w.name, h.w.gen, h.begin)
				}
			}
			if reach.w == nil || h.end > reach.end {
				reach = h
			}
		}
	}

	// The takeover gaps: from a kill to the next B line of each partition
	// the victim owned.
	for _, k := range a.kills {
		if len(k.owned) > 0 {
			r.killsOwning++
		}
		if k.pending > 0 {
			r.killsPending++
			r.pendingAtKill += k.pending
		}
		var gaps []string
		for _, p := range k.owned {
			next := int64(0)
			for _, h := range byPart[p] {
				if h.begin > k.at.UnixNano() && (next == 0 || h.begin < next) {
					next = h.begin
				}
			}
			if next != 0 {
				gap := time.Duration(next - k.at.UnixNano())
				r.gaps = append(r.gaps, gap)
				gaps = append(gaps, fmt.Sprintf("%d: %s", p, gap.Round(time.Millisecond)))
			}
		}
		a.t.Logf("kill of %s (run %d, consumer %q) at +%s: owned partitions %v, %d entries pending to it; next handling of its partitions after %s",
			k.w.name, k.w.gen, a.member(k.w), k.at.Sub(a.start).Round(time.Millisecond), k.owned, k.pending, strings.Join(gaps, ", "))
	}
	slices.Sort(r.gaps)
	return r
}

// afterMove counts the handlings (B lines) of an entry begun after a
// handling of the same entry with a delivery count as high or higher, and
// logs the first few.
func (a *crashPartitioned) afterMove() int {
	type began struct {
		w   *crashWorker
		rec audit.Record
	}
	// An entry id names an entry of one partition's stream: the streams
	// of one topic share ids.
	type entry struct {
		part int
		id   string
	}
	byEntry := map[entry][]began{}
	for _, w := range a.all {
		for _, rec := range a.recs[w] {
			if rec.Kind == audit.Began {
				e := entry{valkeystream.PartitionOf(rec.Key, a.p.Partitions), rec.EntryID}
				byEntry[e] = append(byEntry[e], began{w, rec})
			}
		}
	}
	n := 0
	for e, bs := range byEntry {
		sort.Slice(bs, func(i, j int) bool { return bs[i].rec.At < bs[j].rec.At })
		highest := 0
		var by began
		for _, b := range bs {
			if b.rec.Count <= highest {
				n++
				if n <= 3 {
					a.t.Logf("handled after a move: entry %s of partition %d (key %s, message %d) begun by %s (run %d) with delivery count %d %s after %s (run %d) began it with count %d",
						e.id, e.part, b.rec.Key, b.rec.Seq, b.w.name, b.w.gen, b.rec.Count, time.Duration(b.rec.At-by.rec.At), by.w.name, by.w.gen, by.rec.Count)
				}
				continue
			}
			highest, by = b.rec.Count, b
		}
	}
	return n
}

// crashGapSummary is the min, median, 90th percentile and max of gaps,
// sorted.
func crashGapSummary(gaps []time.Duration) string {
	if len(gaps) == 0 {
		return "none"
	}
	q := func(f float64) time.Duration { return gaps[int(f*float64(len(gaps)-1))].Round(time.Millisecond) }
	return fmt.Sprintf("min %s, median %s, p90 %s, max %s", q(0), q(0.5), q(0.9), q(1))
}
