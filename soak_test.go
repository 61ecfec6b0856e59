package valkeystream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
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
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/partition"
	"github.com/echomq/valkeystream/internal/soakledger"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The chaos soak: every feature at once, under mixed faults, and every
// promise checked at the end.
//
// Worker processes (internal/soakworker) each run one service, through one
// client and one Watermill router, on one server:
//
//   - a partitioned topic of keyed, numbered messages (round n publishes
//     every key's message n) transformed, one output per input, into a
//     second topic under ExactlyOnce; the handler checks its message's
//     context first, and a few handlings ask for a retry (RetryAfter, a
//     plain Nack on a partitioned topic);
//   - a plain consumer group on a third topic, through the Deduplicator and
//     the DeadLetter middleware: some messages ask once to come back later
//     (RetryAfter), some are delayed (Watermill's delay metadata), some are
//     poison (the handler fails them until their UUID is in a set on the
//     server, which the soak fills at the end, then replays their dead
//     letters with `valkeystream dead replay`);
//   - a fan-out subscription of the third topic from its head.
//
// A fault scheduler, seeded (VALKEYSTREAM_CRASH_SEED repeats its choices,
// as in the crash audits), plays one fault at a time, after a random
// pause, chosen among: SIGKILL of a worker (restarted at once or a little
// later, under its name or a new one; one kill in four kills the new run
// again while it starts), a freeze (SIGSTOP past the partitions' owner
// TTL, the consumer leases and ClaimMinIdle, then SIGCONT), and the faults
// of the servers the soak runs on (soakTopology): on one server, a network
// cut of one worker (each reaches the server through a proxy of its own),
// a restart of the server (SIGKILL, then the append-only file, fsynced on
// every write, replayed), and a worker frozen across a restart; on a
// cluster (soak_cluster_test.go), cuts, planned failovers, and a worker
// frozen across one.
//
// When the faults stop, the soak waits until everything is handled, checks
// the dead letters, fixes the poison messages, replays them, waits again,
// stops the workers, and judges:
//
//   - partitioned topic (the partitioned crash audit's judge,
//     crash_partitioned_test.go): nothing lost, first deliveries in order
//     per key, no two processes handling one partition at once (a handling
//     a freeze interrupted aside), no handling of an entry begun after one
//     of it with as high a delivery count (a stale owner's);
//   - outputs: exactly one per input entry, none of no input;
//   - plain topic: every message handled (a poison one once, after its
//     fix), no handling begun after the message was marked done with its
//     in-progress mark intact (but by a run frozen or cut off within
//     RunningTTL before it was marked, whose own mark, set before the
//     stall, lapsed before its handler began: the Deduplicator's
//     documented limit), no delayed message handled (or
//     seen by the fan-out, or appended to the stream) before its due
//     time, no retry delivered by the process that asked for it before
//     the time it asked;
//   - dead letters: the dead-letter stream held exactly the poison
//     messages, each given up on its MaxDeliveries-th delivery or later,
//     and is empty after the replay;
//   - the fan-out subscription of every last worker saw every entry of
//     the plain stream;
//   - nothing pending and nothing unread in any group, nothing left
//     waiting in the delayed set.
//
// Times are compared across processes by the wall clock: the workers, the
// test and the server run on one machine (the server's TIME is the same
// clock), so a delayed message handled before the moment its delay was
// asked (delay.For, just before its Publish call) plus the delay was
// handled early, whatever the machine's load.

// soakParams sizes a soak.
type soakParams struct {
	For        time.Duration // how long publishing and faults go on
	Workers    int
	Partitions int
	Keys       int           // partition keys: a round publishes one message of each
	RoundEvery time.Duration // the rounds' pace
	PlainEvery time.Duration // the plain topic's publish calls' pace
	PlainBatch int           // messages per plain publish call
	// Shares of the plain messages: poison, asking once for a retry after
	// 200 to 800 ms, delayed by 300 ms to 3 s.
	Poison, Retry, Delayed float64
	TransformRetry         float64          // probability that a transform handling asks for a retry
	FaultPause             [2]time.Duration // before each fault, uniform
	FreezeFor, CutFor      [2]time.Duration // how long a freeze and a cut hold, uniform
	Drain                  time.Duration    // bound on each wait for the workers to catch up
}

// soakCI is the soak of TestChaosSoak: about 90 s (75 s of faults). It
// is the longest test of a pass, so its length is most of what the soak
// adds to one (the 20-minute variants are in soak_stress_test.go).
var soakCI = soakParams{
	For:            75 * time.Second,
	Workers:        3,
	Partitions:     8,
	Keys:           40,
	RoundEvery:     300 * time.Millisecond,
	PlainEvery:     100 * time.Millisecond,
	PlainBatch:     5,
	Poison:         0.01,
	Retry:          0.05,
	Delayed:        0.1,
	TransformRetry: 0.02,
	FaultPause:     [2]time.Duration{500 * time.Millisecond, 2 * time.Second},
	// Past PartitionOwnerTTL (1 s), the leases (500 ms) and ClaimMinIdle
	// (1.5 s); some past the Deduplicator's RunningTTL (3 s) too.
	FreezeFor: [2]time.Duration{1800 * time.Millisecond, 3500 * time.Millisecond},
	CutFor:    [2]time.Duration{500 * time.Millisecond, 4 * time.Second},
	Drain:     3 * time.Minute,
}

// Timings of the soak's workers beside the crash audits' (crash_audit_test.go).
const (
	soakOwnerTTL      = time.Second
	soakMaxDeliveries = 3
	soakRetryAfter    = 50 * time.Millisecond // of the transform's retries
)

// TestChaosSoak runs the chaos soak for about 90 s (75 s of faults,
// VALKEYSTREAM_SOAK_FOR to change it) on a private server. It runs only
// with VALKEYSTREAM_SOAK=1 or =single (see soakWanted): it is meant for a
// few servers of the CI's passes.
// It runs beside the other tests, as the crash audits do: their load on
// the CPU slows its workers down, one more fault, and none of its checks
// depends on how far the workers get.
func TestChaosSoak(t *testing.T) {
	soakWanted(t, "single")
	testserver.Parallel(t) // beside the other tests: their load is one more fault
	p := soakCI
	p.For = soakDuration(t, p.For)
	runSoak(t, p, newSoakSingleServer)
}

// soakWanted skips t unless VALKEYSTREAM_SOAK asks for the soak on this
// topology: 1 (or all) for both, single for one server, cluster for a
// cluster. Anything else fails t, so that a typo does not skip it.
func soakWanted(t *testing.T, topology string) {
	t.Helper()
	switch v := os.Getenv("VALKEYSTREAM_SOAK"); v {
	case "":
		t.Skip("the chaos soak runs with VALKEYSTREAM_SOAK=1 (about 90 s; =single or =cluster for one topology; VALKEYSTREAM_SOAK_FOR=<duration> sets how long the faults go on)")
	case "1", "all", topology:
	case "single", "cluster":
		t.Skipf("VALKEYSTREAM_SOAK=%s: the soak runs on the other topology only", v)
	default:
		t.Fatalf("VALKEYSTREAM_SOAK=%q: want 1 (or all), single or cluster", v)
	}
}

// soakDuration is VALKEYSTREAM_SOAK_FOR, or def.
func soakDuration(t *testing.T, def time.Duration) time.Duration {
	s := os.Getenv("VALKEYSTREAM_SOAK_FOR")
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	require.NoError(t, err, "VALKEYSTREAM_SOAK_FOR")
	require.Positive(t, d, "VALKEYSTREAM_SOAK_FOR")
	return d
}

// soakTopology is the servers a soak runs on: where each worker connects,
// how the test reaches them, and the faults they can play beside the
// workers' own (kill, freeze). One private server (soakSingleServer) and a
// cluster (soakCluster, in soak_cluster_test.go) are two; a Sentinel group
// would be another.
type soakTopology interface {
	// describe names the servers, for the logs.
	describe() string
	// newClient returns a client of the servers for the test (publishing,
	// inspecting), closed when the test ends; timeout is its read and
	// write timeout, 0 for go-redis' defaults.
	newClient(t *testing.T, timeout time.Duration) redis.UniversalClient
	// cliArgs are the flags that point the valkeystream command at the
	// servers.
	cliArgs() []string
	// workerArgs are the flags that point worker slot's client at the
	// servers (through the slot's proxies).
	workerArgs(slot int) []string
	// perSlotOutputs reports whether each output goes to the output topic
	// of its input partition's hash tag (soakworker -output-per-slot), as
	// on a cluster, where a step's keys must share the input's slot.
	perSlotOutputs() bool
	// faults are the topology's faults.
	faults() []soakFault
}

// soakFault is one kind of fault: play returns what it did, for the log;
// plural names the fault in the summary ("3 cuts").
type soakFault struct {
	plural string
	weight int
	play   func(s *soak) string
}

// soakSingleServer is one private server, which each worker slot reaches
// through a proxy of its own.
type soakSingleServer struct {
	srv     *testserver.Server
	proxies []*testserver.Proxy
}

func newSoakSingleServer(t *testing.T, workers int) soakTopology {
	n := &soakSingleServer{srv: testserver.Start(t)}
	require.True(t, n.srv.Restartable(), "the soak restarts its server: it needs a private one, not VALKEYSTREAM_TEST_ADDR")
	for range workers {
		n.proxies = append(n.proxies, testserver.NewProxy(t, n.srv.Addr()))
	}
	return n
}

func (n *soakSingleServer) describe() string {
	return fmt.Sprintf("%s %s (one server)", n.srv.Name(), n.srv.Version())
}

func (n *soakSingleServer) newClient(t *testing.T, timeout time.Duration) redis.UniversalClient {
	c := redis.NewClient(&redis.Options{Addr: n.srv.Addr(), ReadTimeout: timeout, WriteTimeout: timeout})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (n *soakSingleServer) cliArgs() []string { return []string{"--addr", n.srv.Addr()} }

func (n *soakSingleServer) workerArgs(slot int) []string {
	return []string{"-addr", n.proxies[slot].Addr()}
}

func (n *soakSingleServer) perSlotOutputs() bool { return false }

func (n *soakSingleServer) faults() []soakFault {
	faults := []soakFault{
		{plural: "cuts", weight: 3, play: func(s *soak) string {
			slot := s.pa.rng.IntN(len(n.proxies))
			return s.cut(slot, n.proxies[slot:slot+1])
		}},
		{plural: "server restarts", weight: 2, play: func(s *soak) string {
			from := time.Now()
			require.NoError(s.t, n.srv.Restart(), "restarting the server")
			return fmt.Sprintf("server killed and started again, answering after %s", time.Since(from).Round(time.Millisecond))
		}},
	}
	if crashCanFreeze {
		faults = append(faults, soakFault{plural: "freezes across a server restart", weight: 1, play: func(s *soak) string {
			// The worker wakes to a server that restarted meanwhile, its
			// partitions, leases and entries gone to the others.
			return s.frozenAcross("a server restart", func() { require.NoError(s.t, n.srv.Restart(), "restarting the server") })
		}})
	}
	return faults
}

// frozenAcross freezes a worker (SIGSTOP), plays fault (what) meanwhile,
// holds the freeze for FreezeFor in all, and resumes the worker (SIGCONT).
func (s *soak) frozenAcross(what string, fault func()) string {
	t, a := s.t, s.pa
	w := s.slots[a.rng.IntN(len(s.slots))]
	s.learnMember(w)
	hold := time.Duration(0)
	if s.p.FreezeFor[1] > s.p.FreezeFor[0] {
		hold = time.Duration(a.rng.Int64N(int64(s.p.FreezeFor[1] - s.p.FreezeFor[0])))
	}
	hold += s.p.FreezeFor[0]
	f := crashPartitionedFreeze{w: w.crashWorker}
	require.NoError(t, crashStop(w.cmd.Process))
	f.from = time.Now().UnixNano()
	for i, record := range a.ownerRecords() {
		if a.owns(w.crashWorker, i, record) {
			f.owned++
		}
	}
	fault()
	time.Sleep(time.Until(time.Unix(0, f.from).Add(hold))) // the freeze is the scenario
	f.to = time.Now().UnixNano()
	require.NoError(t, crashCont(w.cmd.Process))
	a.freezes = append(a.freezes, f)
	return fmt.Sprintf("%s (run %d) frozen for %s across %s", w.name, w.gen, time.Duration(f.to-f.from).Round(time.Millisecond), what)
}

// cut holds every byte between the worker of slot and the servers (its
// proxies) for CutFor, then lets them through.
func (s *soak) cut(slot int, proxies []*testserver.Proxy) string {
	from := time.Now()
	for _, p := range proxies {
		p.Cut()
	}
	s.pa.sleepRandom(s.p.CutFor[0], s.p.CutFor[1]) // the cut is the scenario
	for _, p := range proxies {
		p.Heal()
	}
	s.cuts = append(s.cuts, soakCut{w: s.slots[slot], from: from.UnixNano(), to: time.Now().UnixNano()})
	return fmt.Sprintf("network of %s (run %d) cut for %s", s.slots[slot].name, s.slots[slot].gen, time.Since(from).Round(time.Millisecond))
}

// soakWorker is one run of a worker process: the partitioned crash
// audit's view of it (its process, log and transform ledger), and its
// ledger of the plain group and the fan-out.
type soakWorker struct {
	*crashWorker
	slot   int
	ledger *soakledger.Reader
	recs   []soakledger.Record
	seen   map[string]bool // entry ids its fan-out saw; nil once the run was killed
}

// soak is one run of the chaos soak.
type soak struct {
	t    *testing.T
	p    soakParams
	topo soakTopology
	// pa is the partitioned crash audit on the transform's input topic:
	// its kills, freezes, ledgers and judge.
	pa *crashPartitioned

	bin, cli                 string
	plain, output, fixedKey  string
	slots                    []*soakWorker // the live run of each slot
	runs                     []*soakWorker // every run
	faultKinds               []soakFault
	faultCount               map[string]int // by plural
	fixedAt                  int64          // when the poison messages were fixed, Unix ns
	start                    time.Time
	sameName, abandonedNames int
	earlyKills               int // kills of a run while it started
	cuts                     []soakCut
	firstSeen                map[string]int64 // uuid -> the first fan-out line of it, Unix ns
}

// soakCut is one network cut of a run, Unix ns: from just before it began
// to just after it healed.
type soakCut struct {
	w        *soakWorker
	from, to int64
}

func runSoak(t *testing.T, p soakParams, topology func(*testing.T, int) soakTopology) {
	started := time.Now()
	topo := topology(t, p.Workers)
	bin := soakBuild(t, "./internal/soakworker", "soakworker")
	cli := soakBuild(t, "./cmd/valkeystream", "valkeystream")
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("VALKEYSTREAM_CRASH_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "VALKEYSTREAM_CRASH_SEED")
	}
	t.Logf("chaos soak seed %d (VALKEYSTREAM_CRASH_SEED=%d repeats the random choices) on %s, %s of faults", seed, seed, topo.describe(), p.For)

	id := watermill.NewShortUUID()
	topic := "soak-" + id + "-orders"
	layout, err := partition.NewLayout(topic, p.Partitions)
	require.NoError(t, err)
	s := &soak{
		t: t, p: p, topo: topo, bin: bin, cli: cli,
		plain: "soak-" + id + "-payments", output: "soak-" + id + "-enriched", fixedKey: "soak-" + id + "-fixed",
		faultCount: map[string]int{}, firstSeen: map[string]int64{},
	}
	s.pa = &crashPartitioned{
		crashRig: crashRig{t: t, admin: topo.newClient(t, 15*time.Second), bin: bin, dir: t.TempDir(),
			topic: topic, group: "transform", rng: rand.New(rand.NewPCG(seed, 0x50a4)), seed: seed},
		p: crashPartitionedParams{Partitions: p.Partitions, Workers: p.Workers, Keys: p.Keys,
			OwnerTTL: soakOwnerTTL, RetryProb: p.TransformRetry, FreezeFor: p.FreezeFor},
		layout:      layout,
		recs:        map[*crashWorker][]audit.Record{},
		seenRecords: map[seenRecord]bool{},
	}
	t.Cleanup(s.pa.killAll)
	if keep := os.Getenv("VALKEYSTREAM_SOAK_KEEP"); keep != "" {
		// Runs before t.TempDir's own removal (cleanups run last first).
		t.Cleanup(func() { s.keep(keep) })
	}

	s.start = time.Now()
	s.pa.start = s.start
	for slot := range p.Workers {
		s.slots = append(s.slots, s.spawn(slot, fmt.Sprintf("w%d-0", slot)))
	}
	stop := make(chan struct{})
	partDone := make(chan crashPartitionedPublished, 1)
	plainDone := make(chan soakPlainPublished, 1)
	go func() { partDone <- s.publishPartitioned(stop) }()
	go func() { plainDone <- s.publishPlain(stop, rand.New(rand.NewPCG(seed, 0x9a1))) }()

	s.playFaults()
	close(stop)
	part, plain := <-partDone, <-plainDone
	require.NoError(t, part.err, "publishing to the partitioned topic")
	require.NoError(t, plain.err, "publishing to the plain topic")
	chaosEnded := time.Now()

	// Everything handled, the poison messages dead-lettered, nothing
	// pending; then the dead letters, the fix and the replay.
	s.waitFor("the faults' backlog to drain", func() (bool, string) { return s.drained(part, plain, false) })
	drained := time.Since(chaosEnded)
	dead := s.deadLetters(plain)
	replayed := s.replay()
	s.waitFor("the replayed poison messages to be handled", func() (bool, string) { return s.drained(part, plain, true) })

	for _, w := range s.slots {
		w.stop(t)
	}
	s.readLedgers()
	ok, why := s.partitionsSettled()
	require.True(t, ok, "the partitioned topic's groups after the workers stopped: %s", why)
	ok, why = s.groupSettled(s.plain, "plain")
	require.True(t, ok, "the plain group after the workers stopped: %s", why)

	r := s.pa.judge(part)
	r.kills, r.freezes = len(s.pa.kills), len(s.pa.freezes)
	partDead, err := s.pa.admin.XLen(context.Background(), topic+valkeystream.DefaultDeadLetterSuffix).Result()
	require.NoError(t, err)
	out := s.judgeOutputs(part)
	pl := s.judgePlain(plain)
	fan := s.judgeFanOut()
	st := s.workerStats()

	var kinds []string
	for _, f := range s.faultKinds {
		kind := fmt.Sprintf("%d %s", s.faultCount[f.plural], f.plural)
		if f.plural == "kills" {
			kind = fmt.Sprintf("%d kills (%d of a run while it started; %d restarts under the same name, %d names abandoned)",
				len(s.pa.kills), s.earlyKills, s.sameName, s.abandonedNames)
		}
		kinds = append(kinds, kind)
	}
	faults := strings.Join(kinds, ", ")
	t.Logf("chaos soak summary: server %s, seed %d, %s of faults (%s), %d processes; drained %s after the faults; "+
		"partitioned: %d messages (%d keys, %d partitions), %d lost, %d out of order, %d handled after a move, %d overlapping handlings, %d handled again, %d retries, %d handlings a freeze interrupted, %d late hand-overs, %d taken with their context ended, takeover gaps %s; "+
		"outputs: %d input entries, %d without an output, %d with more than one, %d stray, %d steps superseded; "+
		"plain: %d messages (%d delayed, %d asking for a retry, %d poison), %d lost, %d handled again, %d begun after marked done (%d more by a run frozen or cut off as it was marked), %d marked with a lost mark, %d delayed handled early, %d retries early, %d retries asked; "+
		"dead letters: %d (%d poison messages, %d others, %d missing, %d given up early), %d replayed, %d poison handled once after the fix, %d otherwise; "+
		"fan-out: %d last runs saw %d entries each, %d missing; publish calls failed and retried: %d; pending at the end: 0",
		topo.describe(), seed, p.For, faults, s.pa.spawns, drained.Round(time.Millisecond),
		len(part.msgs), p.Keys, p.Partitions, r.lost, r.outOfOrderB+r.outOfOrderH, r.afterMove, r.overlaps, r.handledAgain, r.retried, r.frozenInHand, st.Partitions.LateHandOvers, st.Fenced, crashGapSummary(r.gaps),
		out.inputs, out.missing, out.duplicated, out.stray, st.ExactlyOnce.Superseded+int64(out.supersededLogged),
		len(plain.msgs), plain.delayed, plain.retries, len(plain.poison), pl.lost, pl.handledAgain, pl.afterDone, pl.stalledLate, pl.lateMarks, pl.delayedEarly, pl.retriesEarly, pl.retriesAsked,
		dead.letters, dead.poison, dead.others, dead.missing, dead.early, replayed, pl.poisonOnce, pl.poisonOther,
		fan.runs, fan.entries, fan.missing, part.failures+plain.failures)
	t.Logf("| %s | %d | %s | %s | %d (%d keys, %d partitions): %d lost, %d out of order, %d after a move | %d inputs: %d without output, %d with two or more | %d (%d delayed, %d retries, %d poison): %d lost, %d begun after done, %d delayed early, %d retries early | %d dead letters = %d poison, %d replayed, %d handled once after the fix | %d runs, %d missing | 0 pending |",
		topo.describe(), seed, p.For, faults, len(part.msgs), p.Keys, p.Partitions, r.lost, r.outOfOrderB+r.outOfOrderH, r.afterMove,
		out.inputs, out.missing, out.duplicated, len(plain.msgs), plain.delayed, plain.retries, len(plain.poison),
		pl.lost, pl.afterDone, pl.delayedEarly, pl.retriesEarly, dead.letters, dead.poison, replayed, pl.poisonOnce, fan.runs, fan.missing)
	t.Logf("wall time %s", time.Since(started).Round(100*time.Millisecond))

	if r.lost > 0 || r.mismatches > 0 {
		t.Errorf("partitioned: %d messages lost, %d ledger lines with another key or sequence number than published (seed %d)", r.lost, r.mismatches, seed)
	}
	if r.outOfOrderB > 0 || r.outOfOrderH > 0 {
		t.Errorf("partitioned: per-key order broken: %d messages first handled (began) after a later message of their key, %d by the first finished handling (seed %d)",
			r.outOfOrderB, r.outOfOrderH, seed)
	}
	if r.overlaps > 0 {
		t.Errorf("partitioned: %d pairs of handlings of one partition in two processes at once (seed %d)", r.overlaps, seed)
	}
	if r.afterMove > 0 {
		t.Errorf("partitioned: %d handlings of an entry by a worker that had lost it (seed %d)", r.afterMove, seed)
	}
	if partDead > 0 {
		t.Errorf("partitioned: %d dead letters, where no message fails (seed %d)", partDead, seed)
	}
	if out.missing > 0 || out.duplicated > 0 || out.stray > 0 || out.lost > 0 {
		t.Errorf("outputs: %d input entries without an output, %d with more than one, %d outputs of no input entry, %d published inputs in no partition stream (seed %d)",
			out.missing, out.duplicated, out.stray, out.lost, seed)
	}
	if pl.lost > 0 || pl.afterDone > 0 || pl.delayedEarly > 0 || pl.retriesEarly > 0 || pl.poisonOther > 0 || pl.unknown > 0 {
		t.Errorf("plain: %d messages never handled, %d handlings begun after their message was marked done, %d delayed messages handled, seen or appended before their due time, %d retries delivered before their time, %d poison messages not handled exactly once after their fix, %d ledger lines of no published message (seed %d)",
			pl.lost, pl.afterDone, pl.delayedEarly, pl.retriesEarly, pl.poisonOther, pl.unknown, seed)
	}
	if dead.others > 0 || dead.missing > 0 || dead.early > 0 {
		t.Errorf("dead letters: %d of messages that are not poison, %d poison messages without one, %d given up before delivery %d (seed %d)",
			dead.others, dead.missing, dead.early, soakMaxDeliveries, seed)
	}
	if races := s.races(); races > 0 {
		t.Errorf("%d worker runs reported a data race (VALKEYSTREAM_SOAK_RACE)", races)
	}
	if fan.missing > 0 {
		t.Errorf("fan-out: %d entries of the plain stream missing from a last run's fan-out (seed %d)", fan.missing, seed)
	}
}

// keep copies the workers' logs and ledgers to a directory of their own
// under dir when the test failed (VALKEYSTREAM_SOAK_KEEP=dir).
func (s *soak) keep(dir string) {
	if !s.t.Failed() {
		return
	}
	to := filepath.Join(dir, fmt.Sprintf("%s-%d", s.t.Name(), s.pa.seed))
	if err := os.CopyFS(to, os.DirFS(s.pa.dir)); err != nil {
		s.t.Logf("keeping the workers' files: %v", err)
		return
	}
	s.t.Logf("the workers' logs and ledgers are in %s", to)
}

// spawn starts a worker process in slot under the consumer name.
func (s *soak) spawn(slot int, name string) *soakWorker {
	s.t.Helper()
	a := s.pa
	a.spawns++
	base := filepath.Join(a.dir, fmt.Sprintf("%03d-%s", a.spawns, name))
	w := &soakWorker{
		crashWorker: &crashWorker{
			name: name, gen: a.spawns, logPath: base + ".log", ledger: audit.NewReader(base + ".transform"),
			began: map[string]bool{}, ended: map[string]bool{}, done: make(chan struct{}),
		},
		slot:   slot,
		ledger: soakledger.NewReader(base + ".plain"),
		seen:   map[string]bool{},
	}
	ackFlush := []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond}[a.rng.IntN(3)]
	batch := []int{20, 50, 100}[a.rng.IntN(3)]
	handle := time.Duration(1+a.rng.IntN(3)) * time.Millisecond // of each transform handling
	args := append(s.topo.workerArgs(slot),
		"-consumer", name,
		"-seed", strconv.FormatUint(a.rng.Uint64(), 10),
		"-partitioned", a.topic,
		"-partitions", strconv.Itoa(s.p.Partitions),
		"-output", s.output,
		"-transform-group", a.group,
		"-plain", s.plain,
		"-plain-group", "plain",
		"-fixed-key", s.fixedKey,
		"-max-deliveries", strconv.Itoa(soakMaxDeliveries),
		"-retry-prob", strconv.FormatFloat(s.p.TransformRetry, 'g', -1, 64),
		"-retry-after", soakRetryAfter.String(),
		"-handle-time", handle.String(),
		"-block", crashBlockTime.String(),
		"-claim-interval", crashClaimInterval.String(),
		"-claim-min-idle", crashClaimMinIdle.String(),
		"-ack-flush", ackFlush.String(),
		"-lease-ttl", crashLeaseTTL.String(),
		"-partition-ttl", soakOwnerTTL.String(),
		"-running-ttl", crashDedupRunningTTL.String(),
		"-batch", strconv.Itoa(batch),
		"-partition-ledger", w.crashWorker.ledger.Path(),
		"-ledger", w.ledger.Path(),
	)
	if s.topo.perSlotOutputs() {
		args = append(args, "-output-per-slot")
	}
	if os.Getenv("VALKEYSTREAM_TEST_LOG") == "debug" {
		args = append(args, "-v")
	}
	a.startWorker(w.crashWorker, args)
	s.runs = append(s.runs, w)
	return w
}

// playFaults plays faults one after the other until p.For has passed.
func (s *soak) playFaults() {
	t, a := s.t, s.pa
	faults := []soakFault{
		{plural: "kills", weight: 3, play: (*soak).kill},
		{plural: "freezes", weight: 2, play: (*soak).freeze},
	}
	if !crashCanFreeze {
		faults = faults[:1]
	}
	faults = append(faults, s.topo.faults()...)
	s.faultKinds = faults
	total := 0
	for _, f := range faults {
		total += f.weight
	}
	for n := 1; time.Since(s.start) < s.p.For; n++ {
		a.sleepRandom(s.p.FaultPause[0], s.p.FaultPause[1]) // the pace of the faults is the scenario
		s.checkAlive()
		pick := a.rng.IntN(total)
		var f soakFault
		for _, f = range faults {
			if pick < f.weight {
				break
			}
			pick -= f.weight
		}
		at := time.Since(s.start)
		what := f.play(s)
		s.faultCount[f.plural]++
		t.Logf("fault %d at +%s: %s", n, at.Round(time.Millisecond), what)
	}
}

// kill SIGKILLs a worker and starts another in its slot, at once or a
// little later, under its name or a new one.
func (s *soak) kill() string { return s.killSlot(s.pa.rng.IntN(len(s.slots))) }

// killSlot kills the worker of slot and starts the next (see kill).
func (s *soak) killSlot(slot int) string {
	a := s.pa
	victim := s.slots[slot]
	s.learnMember(victim)
	a.kill(victim.crashWorker)
	victim.seen = nil // only the live runs' fan-outs are judged
	name := victim.name
	if a.rng.IntN(2) == 0 {
		s.sameName++
	} else {
		// The old name is never used again: its partitions lapse, and a
		// peer reclaims what it left pending in the plain group.
		s.abandonedNames++
		name = fmt.Sprintf("w%d-%d", slot, a.spawns)
	}
	a.sleepRandom(0, 300*time.Millisecond)
	s.slots[slot] = s.spawn(slot, name)
	what := fmt.Sprintf("%s (run %d) killed, %s (run %d) started", victim.name, victim.gen, name, s.slots[slot].gen)
	if a.rng.IntN(4) == 0 {
		// Kill the new run too while it starts: it drains, takes over
		// leases and acquires partitions, and entries die a second time.
		a.sleepRandom(30*time.Millisecond, 250*time.Millisecond)
		s.earlyKills++
		what += "; then " + s.killSlot(slot)
	}
	return what
}

// freeze stops a worker with SIGSTOP for FreezeFor, then resumes it.
func (s *soak) freeze() string {
	slot := s.pa.rng.IntN(len(s.slots))
	w := s.slots[slot]
	from := time.Now()
	s.learnMember(w)
	s.pa.freeze(w.crashWorker)
	return fmt.Sprintf("%s (run %d) frozen for %s", w.name, w.gen, time.Since(from).Round(time.Millisecond))
}

// learnMember reads, once the worker has logged it, the consumer name its
// transform subscription took: its member id on the partitioned topic,
// which the partitioned audit's kill and freeze look for in the owner
// records and the pending lists.
func (s *soak) learnMember(w *soakWorker) {
	if w.member != "" {
		return
	}
	data, err := os.ReadFile(w.logPath)
	require.NoError(s.t, err)
	const prefix = "soakworker: transform subscribed as consumer "
	if _, after, ok := strings.Cut(string(data), prefix); ok {
		if name, _, ok := strings.Cut(after, "\n"); ok {
			w.member = name
		}
	}
}

// checkAlive fails the test if a live worker exited by itself.
func (s *soak) checkAlive() {
	for _, w := range s.slots {
		if w.exited() {
			s.t.Fatalf("worker %s (run %d) exited by itself: %v\n%s", w.name, w.gen, w.waitErr, crashLogTail(w.logPath))
		}
	}
}

// waitFor polls done until it reports true, failing the test after
// p.Drain with what done said last.
func (s *soak) waitFor(what string, done func() (bool, string)) {
	s.t.Helper()
	deadline := time.Now().Add(s.p.Drain)
	for {
		ok, why := done()
		if ok {
			return
		}
		s.checkAlive()
		if time.Now().After(deadline) {
			if ok, why := s.partitionsSettled(); !ok {
				s.t.Log(why)
			}
			s.t.Logf("owner records now: %q", s.pa.ownerRecords())
			for _, w := range s.slots {
				s.t.Logf("worker %s (run %d) log:\n%s", w.name, w.gen, crashLogTail(w.logPath))
			}
			s.t.Fatalf("waited %s for %s: %s (seed %d)", s.p.Drain, what, why, s.pa.seed)
		}
		time.Sleep(100 * time.Millisecond) // the poll of a wait for the workers
	}
}

// readLedgers reads what every run's ledgers added.
func (s *soak) readLedgers() {
	s.pa.readLedgers()
	for _, w := range s.runs {
		recs, err := w.ledger.Read()
		require.NoError(s.t, err)
		for _, r := range recs {
			if r.Kind != soakledger.Seen {
				w.recs = append(w.recs, r)
				continue
			}
			// A fan-out line counts twice: for the run's view of the
			// stream while it lives, and for the first time anyone saw
			// the message (a delayed one must not be seen early). The
			// runs that restart read the whole stream again, so the lines
			// are not kept.
			if w.seen != nil {
				w.seen[r.EntryID] = true
			}
			if at, ok := s.firstSeen[r.UUID]; !ok || r.At < at {
				s.firstSeen[r.UUID] = r.At
			}
		}
	}
}

// drained reports whether the workers have caught up: every partitioned
// message handled and its groups settled; every plain message handled,
// or, before the fix (replayed false), every poison message in the
// dead-letter stream and, after it, handled; the plain group settled and
// nothing waiting in its delayed set; the fan-out of every live run seen
// every entry of the plain stream.
func (s *soak) drained(part crashPartitionedPublished, plain soakPlainPublished, replayed bool) (bool, string) {
	ctx := context.Background()
	s.readLedgers()
	handled := map[string]bool{}
	for _, recs := range s.pa.recs {
		for _, r := range recs {
			if r.Kind == audit.Handled {
				handled[r.UUID] = true
			}
		}
	}
	if n := len(part.msgs) - len(handled); n > 0 {
		return false, fmt.Sprintf("%d of %d partitioned messages not handled", n, len(part.msgs))
	}
	if ok, why := s.partitionsSettled(); !ok {
		return false, why
	}
	plainHandled := map[string]bool{}
	for _, w := range s.runs {
		for _, r := range w.recs {
			if r.Kind == soakledger.Handled {
				plainHandled[r.UUID] = true
			}
		}
	}
	missing := 0
	for id, m := range plain.msgs {
		if !plainHandled[id] && (m.kind != "poison" || replayed) {
			missing++
		}
	}
	if missing > 0 {
		return false, fmt.Sprintf("%d plain messages not handled", missing)
	}
	if !replayed {
		inDead := map[string]bool{}
		for _, e := range crashStreamEntries(s.t, s.pa.admin, s.plain+valkeystream.DefaultDeadLetterSuffix) {
			id, _ := e.Values[valkeystream.FieldUUID].(string)
			inDead[id] = true
		}
		n := 0
		for id := range plain.poison {
			if !inDead[id] {
				n++
			}
		}
		if n > 0 {
			return false, fmt.Sprintf("%d of %d poison messages not dead-lettered", n, len(plain.poison))
		}
	}
	if ok, why := s.groupSettled(s.plain, "plain"); !ok {
		return false, why
	}
	delayedKey, err := valkeystream.DelayedKey(s.plain)
	require.NoError(s.t, err)
	if n, err := s.pa.admin.ZCard(ctx, delayedKey).Result(); err != nil || n > 0 {
		return false, fmt.Sprintf("%d delayed messages waiting (%v)", n, err)
	}
	entries := crashStreamEntries(s.t, s.pa.admin, s.plain)
	for _, w := range s.slots {
		n := 0
		for _, e := range entries {
			if !w.seen[e.ID] {
				n++
			}
		}
		if n > 0 {
			return false, fmt.Sprintf("the fan-out of %s (run %d) has not seen %d of the plain stream's %d entries", w.name, w.gen, n, len(entries))
		}
	}
	return true, ""
}

// partitionsSettled reports whether the group of every partition of the
// transform's input has nothing pending and nothing unread, and if not,
// why.
func (s *soak) partitionsSettled() (bool, string) {
	for i, stream := range s.pa.layout.Streams() {
		if ok, why := s.groupSettled(stream, s.pa.group); !ok {
			return false, fmt.Sprintf("partition %d: %s", i, why)
		}
	}
	return true, ""
}

// groupSettled reports whether group of stream has nothing pending and
// nothing unread (its last delivered entry the stream's last), and if not,
// why. The group's lag (XINFO GROUPS) is not asked: Redis 7.0.15 does not
// pass a group's count of entries read on to its replicas with the reads,
// so after a failover the new master reports a lag of entries the group
// read before it.
func (s *soak) groupSettled(stream, group string) (bool, string) {
	ctx := context.Background()
	info, err := s.pa.admin.XInfoStream(ctx, stream).Result()
	if err != nil {
		return false, fmt.Sprintf("XINFO STREAM %s: %v", stream, err)
	}
	groups, err := s.pa.admin.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return false, fmt.Sprintf("XINFO GROUPS %s: %v", stream, err)
	}
	for _, g := range groups {
		if g.Name != group {
			continue
		}
		if g.Pending != 0 || g.LastDeliveredID != info.LastGeneratedID {
			return false, fmt.Sprintf("group %s of %s: %d pending, last delivered %s of %s, lag %d",
				group, stream, g.Pending, g.LastDeliveredID, info.LastGeneratedID, g.Lag)
		}
		return true, ""
	}
	return false, fmt.Sprintf("no group %s on %s", group, stream)
}

// soakDeadLetters is what the dead-letter stream of the plain topic held
// before the replay.
type soakDeadLetters struct {
	letters int // dead letters
	poison  int // distinct poison messages among them
	others  int // dead letters of messages that are not poison
	missing int // poison messages without a dead letter
	early   int // dead letters of a delivery before the MaxDeliveries-th
	twice   int // dead letters beyond the first of an entry of the plain stream
}

// deadLetters reads the plain topic's dead-letter stream.
func (s *soak) deadLetters(plain soakPlainPublished) soakDeadLetters {
	var d soakDeadLetters
	seen := map[string]bool{}
	ofEntry := map[string]int{}
	for _, e := range crashStreamEntries(s.t, s.pa.admin, s.plain+valkeystream.DefaultDeadLetterSuffix) {
		d.letters++
		msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(e.Values)
		require.NoError(s.t, err, "dead letter %s", e.ID)
		if _, ok := plain.poison[msg.UUID]; !ok {
			d.others++
			s.t.Logf("dead letter %s of message %s, which is not poison: %v", e.ID, msg.UUID, msg.Metadata)
			continue
		}
		if !seen[msg.UUID] {
			seen[msg.UUID] = true
			d.poison++
		}
		if n, _ := strconv.Atoi(msg.Metadata.Get(valkeystream.MetadataOriginalDeliveryCount)); n < soakMaxDeliveries {
			d.early++
			s.t.Logf("dead letter %s of message %s given up on delivery %d", e.ID, msg.UUID, n)
		}
		ofEntry[msg.Metadata.Get(valkeystream.MetadataOriginalStream)+" "+msg.Metadata.Get(valkeystream.MetadataOriginalEntryID)]++
	}
	for _, n := range ofEntry {
		d.twice += n - 1
	}
	d.missing = len(plain.poison) - d.poison
	s.t.Logf("dead letters before the fix: %d, of %d poison messages (%d dead letters beyond the first of an entry)", d.letters, d.poison, d.twice)
	return d
}

// replay fixes the poison messages, replays their dead letters with the
// valkeystream command, and returns how many it appended.
func (s *soak) replay() int {
	t := s.t
	ctx := context.Background()
	var poison []any
	for _, e := range crashStreamEntries(t, s.pa.admin, s.plain+valkeystream.DefaultDeadLetterSuffix) {
		poison = append(poison, e.Values[valkeystream.FieldUUID])
	}
	s.fixedAt = time.Now().UnixNano()
	if len(poison) > 0 {
		require.NoError(t, s.pa.admin.SAdd(ctx, s.fixedKey, poison...).Err())
	}
	cmd := exec.Command(s.cli, append([]string{"dead", "replay", s.plain, "--all", "--yes", "--json", "--limit", "1000000"},
		s.topo.cliArgs()...)...)
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "valkeystream dead replay: %s%s", out, stderr)
	var results []struct {
		UUID, Result string
	}
	require.NoError(t, json.Unmarshal(out, &results), "the output of valkeystream dead replay --json: %s", out)
	appended := 0
	for _, r := range results {
		require.Equal(t, "appended", r.Result, "replay of the dead letter of %s", r.UUID)
		appended++
	}
	n, err := s.pa.admin.XLen(ctx, s.plain+valkeystream.DefaultDeadLetterSuffix).Result()
	require.NoError(t, err)
	require.Zero(t, n, "dead letters left after the replay")
	t.Logf("valkeystream dead replay %s --all: %d dead letters appended to their stream", s.plain, appended)
	return appended
}

// soakOutputs is what the output stream holds against the inputs.
type soakOutputs struct {
	inputs           int // entries in the partition streams
	lost             int // published partitioned messages in no partition stream
	missing          int // input entries without an output
	duplicated       int // input entries with more than one
	stray            int // outputs of no input entry
	supersededLogged int // steps superseded, by the logs of the runs that did not stop gracefully
}

// judgeOutputs counts, per input entry of the partition streams, its
// outputs in the output stream.
func (s *soak) judgeOutputs(part crashPartitionedPublished) soakOutputs {
	var o soakOutputs
	inputs := map[string]int{} // "<stream> <id>" -> outputs
	inStream := map[string]bool{}
	for _, stream := range s.pa.layout.Streams() {
		for _, e := range crashStreamEntries(s.t, s.pa.admin, stream) {
			inputs[stream+" "+e.ID] = 0
			id, _ := e.Values[valkeystream.FieldUUID].(string)
			inStream[id] = true
		}
	}
	o.inputs = len(inputs)
	for id := range part.msgs {
		if !inStream[id] {
			o.lost++
		}
	}
	for _, e := range s.outputEntries() {
		msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(e.Values)
		require.NoError(s.t, err, "output entry %s", e.ID)
		k := msg.Metadata.Get("input_stream") + " " + msg.Metadata.Get("input_entry")
		if _, ok := inputs[k]; !ok {
			o.stray++
			continue
		}
		inputs[k]++
	}
	var examples []string
	for k, n := range inputs {
		switch {
		case n == 0:
			o.missing++
		case n > 1:
			o.duplicated++
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("%s: %d outputs", k, n))
			}
		}
	}
	if len(examples) > 0 {
		sort.Strings(examples)
		s.t.Logf("input entries with more than one output: %s", strings.Join(examples, "; "))
	}
	for _, w := range s.runs {
		if w.waitErr == nil { // stopped gracefully: its stats count them
			continue
		}
		data, err := os.ReadFile(w.logPath)
		require.NoError(s.t, err)
		o.supersededLogged += strings.Count(string(data), "The input is no longer this delivery's")
	}
	return o
}

// outputEntries returns every entry of the output topic: of each
// partition's output topic with per-slot outputs.
func (s *soak) outputEntries() []redis.XMessage {
	if !s.topo.perSlotOutputs() {
		return crashStreamEntries(s.t, s.pa.admin, s.output)
	}
	var all []redis.XMessage
	for _, stream := range s.pa.layout.Streams() {
		open, end := strings.IndexByte(stream, '{'), strings.IndexByte(stream, '}')
		require.True(s.t, open >= 0 && end > open, "partition stream %s has no hash tag", stream)
		all = append(all, crashStreamEntries(s.t, s.pa.admin, s.output+stream[open:end+1])...)
	}
	return all
}

// soakPlainVerdict is what the ledgers say of the plain topic.
type soakPlainVerdict struct {
	lost         int // messages (not poison) with no H line
	handledAgain int // messages with more than one H line
	afterDone    int // B lines after an M line of their message, no stall of their run near it
	stalledLate  int // B lines after an M line, of a run frozen or cut off within RunningTTL before the M line
	lateMarks    int // L lines
	delayedEarly int // delayed messages handled, seen or appended before their due time (counted once each)
	retriesEarly int // retries delivered by the process that asked before their time
	retriesAsked int // R lines
	poisonOnce   int // poison messages with exactly one H line, after the fix
	poisonOther  int // poison messages handled otherwise
	unknown      int // lines of no published message
}

// judgePlain reads the plain group's and the fan-out's ledger lines
// against what was published.
func (s *soak) judgePlain(plain soakPlainPublished) soakPlainVerdict {
	var v soakPlainVerdict
	handled := map[string][]int64{}
	doneAt := map[string]int64{} // the first M line of each message
	for _, w := range s.runs {
		for _, r := range w.recs {
			switch r.Kind {
			case soakledger.Handled:
				handled[r.UUID] = append(handled[r.UUID], r.At)
			case soakledger.Marked:
				if at, ok := doneAt[r.UUID]; !ok || r.At < at {
					doneAt[r.UUID] = r.At
				}
			case soakledger.MarkedLate:
				v.lateMarks++
			case soakledger.Retried:
				v.retriesAsked++
			}
		}
	}
	early := map[string]bool{} // delayed messages handled, seen or appended early
	var examples []string
	example := func(format string, args ...any) {
		if len(examples) < 10 {
			examples = append(examples, fmt.Sprintf(format, args...))
		}
	}
	for _, w := range s.runs {
		type asked struct {
			at    int64
			after time.Duration
		}
		retry := map[string]asked{} // entry id -> this run's last R line of it
		for i, r := range w.recs {
			m, ok := plain.msgs[r.UUID]
			if !ok {
				v.unknown++
				continue
			}
			due := m.from + int64(m.delay)
			switch r.Kind {
			case soakledger.Began:
				if at, ok := doneAt[r.UUID]; ok && r.At > at {
					if s.stalled(w, at-int64(crashDedupRunningTTL), at) && !markedIntact(w.recs[i+1:], r.EntryID) {
						// Frozen or cut off after its in-progress mark was
						// set (or while the reply that it was set was on its
						// way) and before its handler began, past
						// RunningTTL: a peer handled the message meanwhile
						// (the documented limit: a stall past RunningTTL can
						// lose the mark while a duplicate runs), and this
						// handling did not find its mark intact.
						v.stalledLate++
						example("message %s begun by %s (run %d, count %d) %s after it was marked done, the run stalled (frozen or cut off) meanwhile: the documented limit",
							r.UUID, w.name, w.gen, r.Count, time.Duration(r.At-at))
					} else {
						v.afterDone++
						example("message %s begun by %s (run %d, count %d) %s after it was marked done", r.UUID, w.name, w.gen, r.Count, time.Duration(r.At-at))
					}
				}
				if q, ok := retry[r.EntryID]; ok {
					delete(retry, r.EntryID)
					if r.At < q.at+int64(q.after) {
						v.retriesEarly++
						example("message %s delivered again to %s (run %d) %s after it asked for a retry in %s", r.UUID, w.name, w.gen, time.Duration(r.At-q.at), q.after)
					}
				}
				if m.delay > 0 && r.At < due {
					early[r.UUID] = true
					example("delayed message %s handled by %s (run %d) %s before its due time", r.UUID, w.name, w.gen, time.Duration(due-r.At))
				}
			case soakledger.Retried:
				retry[r.EntryID] = asked{r.At, m.retryAfter}
			}
		}
	}
	for id, at := range s.firstSeen {
		if m, ok := plain.msgs[id]; !ok {
			v.unknown++
		} else if due := m.from + int64(m.delay); m.delay > 0 && at < due {
			early[id] = true
			example("delayed message %s seen by a fan-out %s before its due time", id, time.Duration(due-at))
		}
	}
	for _, e := range crashStreamEntries(s.t, s.pa.admin, s.plain) {
		id, _ := e.Values[valkeystream.FieldUUID].(string)
		m := plain.msgs[id]
		ms, err := strconv.ParseInt(strings.SplitN(e.ID, "-", 2)[0], 10, 64)
		require.NoError(s.t, err, "entry id %s", e.ID)
		if due := m.from + int64(m.delay); m.delay > 0 && ms*int64(time.Millisecond) < due {
			early[id] = true
			example("delayed message %s appended to the stream as %s, %s before its due time", id, e.ID, time.Duration(due-ms*int64(time.Millisecond)))
		}
	}
	for id, m := range plain.msgs {
		hs := handled[id]
		switch {
		case m.kind == "poison":
			if len(hs) == 1 && hs[0] > s.fixedAt {
				v.poisonOnce++
			} else {
				v.poisonOther++
				example("poison message %s handled %d times (the fix at %d): %v", id, len(hs), s.fixedAt, hs)
			}
		case len(hs) == 0:
			v.lost++
			example("message %s (%+v) never handled", id, m)
		case len(hs) > 1:
			v.handledAgain++
		}
	}
	v.delayedEarly = len(early)
	for _, ex := range examples {
		s.t.Log("plain: " + ex)
	}
	return v
}

// markedIntact reports whether the first mark line of the entry id in
// recs (the lines of a run after a B line of it) is M: the handling found
// its in-progress mark intact, so it cannot have lost it to a peer.
func markedIntact(recs []soakledger.Record, id string) bool {
	for _, r := range recs {
		if r.EntryID != id {
			continue
		}
		switch r.Kind {
		case soakledger.Marked:
			return true
		case soakledger.MarkedLate, soakledger.GivenUp, soakledger.Began:
			return false
		}
	}
	return false
}

// stalled reports whether the run w was frozen or cut off at some instant
// between from and to (Unix ns).
func (s *soak) stalled(w *soakWorker, from, to int64) bool {
	for _, f := range s.pa.freezes {
		if f.w == w.crashWorker && f.from < to && f.to > from {
			return true
		}
	}
	for _, c := range s.cuts {
		if c.w == w && c.from < to && c.to > from {
			return true
		}
	}
	return false
}

// soakFanOut is what the last runs' fan-out subscriptions saw.
type soakFanOut struct {
	runs, entries, missing int
}

// judgeFanOut checks that the fan-out of every last run saw every entry
// of the plain stream.
func (s *soak) judgeFanOut() soakFanOut {
	entries := crashStreamEntries(s.t, s.pa.admin, s.plain)
	f := soakFanOut{runs: len(s.slots), entries: len(entries)}
	for _, w := range s.slots {
		for _, e := range entries {
			if !w.seen[e.ID] {
				f.missing++
			}
		}
	}
	return f
}

// races counts the runs whose log holds a report of the race detector
// (with VALKEYSTREAM_SOAK_RACE), and logs the first.
func (s *soak) races() int {
	n := 0
	for _, w := range s.runs {
		data, err := os.ReadFile(w.logPath)
		require.NoError(s.t, err)
		if i := strings.Index(string(data), "WARNING: DATA RACE"); i >= 0 {
			if n == 0 {
				s.t.Logf("data race in %s (run %d):\n%s", w.name, w.gen, data[i:min(len(data), i+6000)])
			}
			n++
		}
	}
	return n
}

// soakStats are the counters of the runs that stopped gracefully (the last
// ones), added up: the workers' "soakworker: stats" lines.
type soakStats struct {
	Fenced      int64
	Partitions  valkeystream.PartitionStats
	ExactlyOnce valkeystream.ExactlyOnceStats
	Dedup       valkeystream.DedupStats
	PlainNacks  valkeystream.NackStats
}

func (s *soak) workerStats() soakStats {
	var sum soakStats
	for _, w := range s.slots {
		data, err := os.ReadFile(w.logPath)
		require.NoError(s.t, err)
		_, line, ok := strings.Cut(string(data), "soakworker: stats ")
		require.True(s.t, ok, "no stats line in the log of %s (run %d)", w.name, w.gen)
		line, _, _ = strings.Cut(line, "\n")
		var st soakStats
		require.NoError(s.t, json.Unmarshal([]byte(line), &st), "stats of %s (run %d): %s", w.name, w.gen, line)
		sum.Fenced += st.Fenced
		sum.Partitions.LateHandOvers += st.Partitions.LateHandOvers
		sum.Partitions.Fenced += st.Partitions.Fenced
		sum.ExactlyOnce.Superseded += st.ExactlyOnce.Superseded
		sum.Dedup.LostMarks += st.Dedup.LostMarks
		sum.Dedup.MarkFailures += st.Dedup.MarkFailures
		sum.Dedup.Skipped += st.Dedup.Skipped
		sum.PlainNacks.RetryLaterFallbacks += st.PlainNacks.RetryLaterFallbacks
	}
	s.t.Logf("last runs' counters: %d transform messages taken with their context ended, %d late hand-overs, %d ownerships found lost, %d steps superseded, %d lost marks, %d mark failures, %d duplicates skipped, %d retry fallbacks",
		sum.Fenced, sum.Partitions.LateHandOvers, sum.Partitions.Fenced, sum.ExactlyOnce.Superseded, sum.Dedup.LostMarks, sum.Dedup.MarkFailures, sum.Dedup.Skipped, sum.PlainNacks.RetryLaterFallbacks)
	return sum
}

// soakPlain is a published message of the plain topic.
type soakPlain struct {
	kind       string        // "", "retry" or "poison"
	retryAfter time.Duration // of "retry"
	delay      time.Duration // 0: not delayed
	from       int64         // of a delayed message, the wall clock when its delay was asked (Unix ns)
}

type soakPlainPublished struct {
	msgs             map[string]soakPlain
	poison           map[string]bool
	delayed, retries int
	failures         int
	err              error
}

// publishPartitioned publishes rounds, round n every key's message n in
// one call, one every RoundEvery, until stop is closed.
func (s *soak) publishPartitioned(stop <-chan struct{}) crashPartitionedPublished {
	res := crashPartitionedPublished{msgs: map[string]crashKeyed{}}
	client := s.topo.newClient(s.t, 0)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: client, Partitions: map[string]int{s.pa.topic: s.p.Partitions}, IdempotentWindow: time.Minute,
	}, testLogger())
	if err != nil {
		res.err = err
		return res
	}
	tick := time.NewTicker(s.p.RoundEvery)
	defer tick.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return res
		case <-tick.C:
		}
		msgs := make([]*message.Message, s.p.Keys)
		for k := range msgs {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("k%d/%d", k, seq)))
			m.Metadata.Set(valkeystream.MetadataPartitionKey, fmt.Sprintf("k%d", k))
			m.Metadata.Set("seq", strconv.Itoa(seq))
			msgs[k] = m
		}
		// The round is published before the next: a message written
		// twice comes twice, in order.
		if err := soakPublish(pub, s.pa.topic, msgs, &res.failures); err != nil {
			res.err = fmt.Errorf("round %d: %w", seq, err)
			return res
		}
		for _, m := range msgs {
			res.msgs[m.UUID] = crashKeyed{key: m.Metadata.Get(valkeystream.MetadataPartitionKey), seq: seq}
		}
	}
}

// publishPlain publishes PlainBatch messages every PlainEvery until stop is
// closed: the delayed ones in a call of their own (a call carrying a
// delayed message is not idempotent), the others in one idempotent call.
func (s *soak) publishPlain(stop <-chan struct{}, rng *rand.Rand) soakPlainPublished {
	res := soakPlainPublished{msgs: map[string]soakPlain{}, poison: map[string]bool{}}
	client := s.topo.newClient(s.t, 0)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, IdempotentWindow: time.Minute}, testLogger())
	if err != nil {
		res.err = err
		return res
	}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	tick := time.NewTicker(s.p.PlainEvery)
	defer tick.Stop()
	for n := 0; ; {
		select {
		case <-stop:
			return res
		case <-tick.C:
		}
		var now, later []*message.Message
		kinds := map[string]soakPlain{}
		for range s.p.PlainBatch {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("payment %d", n)))
			n++
			var p soakPlain
			switch x := rng.Float64(); {
			case x < s.p.Poison:
				p.kind = "poison"
			case x < s.p.Poison+s.p.Retry:
				p.kind, p.retryAfter = "retry", between(200*time.Millisecond, 800*time.Millisecond)
				m.Metadata.Set("soak_retry_after", p.retryAfter.String())
			case x < s.p.Poison+s.p.Retry+s.p.Delayed:
				// The delay is asked now: the message is due no earlier
				// than now plus the delay, however late its Publish call
				// goes out (a retried call publishes it later).
				p.delay = between(300*time.Millisecond, 3*time.Second)
				p.from = time.Now().UnixNano()
				delay.Message(m, delay.For(p.delay))
			}
			if p.kind != "" {
				m.Metadata.Set("soak_kind", p.kind)
			}
			kinds[m.UUID] = p
			if p.delay > 0 {
				later = append(later, m)
			} else {
				now = append(now, m)
			}
		}
		for _, msgs := range [][]*message.Message{now, later} {
			if len(msgs) == 0 {
				continue
			}
			if err := soakPublish(pub, s.plain, msgs, &res.failures); err != nil {
				res.err = err
				return res
			}
			for _, m := range msgs {
				p := kinds[m.UUID]
				res.msgs[m.UUID] = p
				switch {
				case p.kind == "poison":
					res.poison[m.UUID] = true
				case p.kind == "retry":
					res.retries++
				case p.delay > 0:
					res.delayed++
				}
			}
		}
	}
}

// soakPublish publishes msgs in one call, again after a failure
// (publishRetrying), for up to a minute: the server may be restarting.
func soakPublish(pub message.Publisher, topic string, msgs []*message.Message, failures *int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := publishRetrying(pub, topic, msgs, failures)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// soakBuild builds the package pkg (a path relative to the module root)
// into a temporary directory and returns the binary. It builds without
// -race (a faster worker lets more faults land mid-stream) unless
// VALKEYSTREAM_SOAK_RACE=1, which checks the library's code in the
// workers for data races under the soak's load.
func soakBuild(t *testing.T, pkg, name string) string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		p, lookErr := exec.LookPath("go")
		if lookErr != nil {
			t.Skipf("the chaos soak builds %s with the go command, which is neither in GOROOT (%s) nor on PATH", pkg, goBin)
		}
		goBin = p
	}
	out := filepath.Join(t.TempDir(), name)
	if runtime.GOOS == "windows" {
		out += ".exe"
	}
	args := []string{"build", "-o", out}
	if os.Getenv("VALKEYSTREAM_SOAK_RACE") != "" {
		args = append(args, "-race")
	}
	if output, err := exec.Command(goBin, append(args, pkg)...).CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, output)
	}
	return out
}
