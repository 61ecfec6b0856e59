package valkeystream_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/testserver"
)

// Worker timings of the crash audit: short enough that an abandoned
// consumer's entries are reclaimed within a couple of seconds. BlockTime and
// every AckFlushInterval below stay under ClaimMinIdle, as Validate demands.
const (
	crashClaimMinIdle  = 1500 * time.Millisecond
	crashClaimInterval = 300 * time.Millisecond
	crashBlockTime     = 200 * time.Millisecond
	// The lease TTL of the workers' consumer names: a worker that comes
	// back under its old base name runs as the next free name at once, and
	// takes over the killed one's entries once this lease lapses.
	crashLeaseTTL = 500 * time.Millisecond
	// crashDedupRunningTTL is how long the in-progress mark of a killed
	// deduplicating worker holds back the message's redelivery.
	crashDedupRunningTTL = 3 * time.Second
)

// crashAuditParams sizes one crash audit.
type crashAuditParams struct {
	Messages   int              // messages published over the run
	Workers    int              // worker processes alive at once
	Rounds     int              // SIGKILLs at least; more until publishing is over and the backlog nearly handled
	KillEvery  [2]time.Duration // pause before each kill, uniform in [0]..[1]
	PublishFor time.Duration    // publishing is spread over about this long
	Batch      int              // messages per Publish call
	Dedup      bool             // workers handle through the Deduplicator
	Delayed    float64          // fraction of messages published with a delay of up to 1 s
	// Transform makes the workers transform stages, one output per input
	// to another topic, ExactlyOnce with its middleware (crash_transform_test.go).
	Transform, ExactlyOnce bool
	// Freezes is how many rounds, spread among the kills, instead stop a
	// worker inside a handler with SIGSTOP for longer than ClaimMinIdle
	// and resume it (see freeze): a peer takes its entries meanwhile, and
	// the resumed handler finishes a delivery no longer its own.
	Freezes int
}

// TestCrashAudit runs consumers as separate processes (internal/crashworker)
// and kills them with SIGKILL at random moments while messages are published
// and handled: between a read and the handler, inside the handler, and
// between the handler and the Ack reaching the server. Killed workers come
// back under the same consumer name (they drain their own pending list) or
// under a new one (the old name is abandoned, and a peer must reclaim its
// entries with XAUTOCLAIM); about one kill in four hits a worker shortly after
// it came back, while it drains or reclaims. Every worker writes a ledger line
// (internal/audit) before each Ack;
// at the end every published message must appear in some ledger and the
// group's pending list must be empty. The figures are logged.
//
// VALKEYSTREAM_CRASH_SEED=<n> repeats the random choices of a run (the kill
// moments still depend on the machine's timing).
//
// The crash audits run beside the parallel tests: their invariants hold
// however much CPU the workers get, which decides only how far each gets
// between two kills; past its Rounds an audit kills only after progress
// (with kills at a steady pace alone, the workers of TestCrashAuditDedup,
// with the parallel tests beside them on two cores, once fell so far
// behind that the audit gave up).
func TestCrashAudit(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	runCrashAudit(t, crashAuditParams{
		Messages:   20000,
		Workers:    3,
		Rounds:     24,
		KillEvery:  [2]time.Duration{150 * time.Millisecond, 600 * time.Millisecond},
		PublishFor: 8 * time.Second,
		Batch:      20,
	})
}

// TestCrashAuditDedup is TestCrashAudit with workers that handle through the
// Deduplicator: a message may still be handled to completion twice, but only
// when a kill landed between its handling and the done mark. A fifth of the
// messages are delayed by up to a second, so the kills also land on workers
// moving due messages into the stream: each must be moved exactly once.
func TestCrashAuditDedup(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	runCrashAudit(t, crashAuditParams{
		Messages:   10000,
		Workers:    3,
		Rounds:     20,
		KillEvery:  [2]time.Duration{150 * time.Millisecond, 600 * time.Millisecond},
		PublishFor: 6 * time.Second,
		Batch:      20,
		Dedup:      true,
		Delayed:    0.2,
	})
}

// crashWorker is one run of the worker process.
type crashWorker struct {
	name    string // consumer name
	gen     int    // spawn number, unique within the audit
	cmd     *exec.Cmd
	stdin   *os.File // closing it asks the worker to stop gracefully
	logPath string
	done    chan struct{} // closed once the process has exited
	waitErr error         // read after done is closed

	ledger *audit.Reader
	began  map[string]bool // entry ids this process began handling
	ended  map[string]bool // entry ids this process finished handling
	killed bool

	// lastEntry is the entry of the last ledger line read of this process.
	lastEntry string

	// With Dedup: the UUID of the last message this process handled, and
	// whether it was marked done afterwards.
	lastHandled       string
	lastHandledMarked bool

	// member is the consumer name the subscription took, as the worker
	// logged it (crash_partitioned_test.go); "" until read.
	member string
}

func (w *crashWorker) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// crashKillStats classifies the kills by what the killed worker left pending,
// judged by its ledger: entries it had read but not begun, the entry in its
// handler, and entries it had handled but whose Ack had not reached the
// server.
type crashKillStats struct {
	kills, queued, inHandler, unacked, idle int
	queuedEntries, unackedEntries           int
}

// crashRig is what every crash audit holds: its private server (and a
// client to inspect it), the worker binary, the directory of the workers'
// logs and ledgers, the topic and group, the random source of its choices,
// and every worker it started.
type crashRig struct {
	t      *testing.T
	srv    *testserver.Server
	admin  redis.UniversalClient
	bin    string
	dir    string
	topic  string
	group  string
	rng    *rand.Rand
	seed   uint64
	spawns int
	all    []*crashWorker // every process ever started
}

// newCrashRig starts the server and builds the worker for the audit named
// name, on topic, with group "audit". Its random choices come from a seed
// drawn now, or from VALKEYSTREAM_CRASH_SEED, which repeats a run's; stream
// tells the audits' sources apart. Every worker still running is killed
// when the test ends.
func newCrashRig(t *testing.T, name, topic string, stream uint64) crashRig {
	srv := testserver.Start(t)
	bin := buildCrashWorker(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("VALKEYSTREAM_CRASH_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "VALKEYSTREAM_CRASH_SEED")
	}
	t.Logf("%s seed %d (VALKEYSTREAM_CRASH_SEED=%d repeats the random choices)", name, seed, seed)
	r := crashRig{t: t, srv: srv, admin: crashAdminClient(t, srv), bin: bin, dir: t.TempDir(),
		topic: topic, group: "audit", rng: rand.New(rand.NewPCG(seed, stream)), seed: seed}
	return r
}

// newWorker returns the next worker, named name, not started yet, and the
// flags every worker takes; each draws its own Ack flush interval (a long
// one widens the window between the handler's end and the Ack reaching
// the server) and batch size.
func (r *crashRig) newWorker(name string) (*crashWorker, []string) {
	r.spawns++
	gen := r.spawns
	base := filepath.Join(r.dir, fmt.Sprintf("%03d-%s", gen, name))
	w := &crashWorker{
		name:    name,
		gen:     gen,
		logPath: base + ".log",
		ledger:  audit.NewReader(base + ".ledger"),
		began:   map[string]bool{},
		ended:   map[string]bool{},
		done:    make(chan struct{}),
	}
	ackFlush := []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond, 900 * time.Millisecond}[r.rng.IntN(4)]
	batch := []int{10, 50, 100}[r.rng.IntN(3)]
	args := []string{
		"-addr", r.srv.Addr(),
		"-topic", r.topic,
		"-group", r.group,
		"-consumer", name,
		"-ledger", w.ledger.Path(),
		"-seed", strconv.FormatUint(r.rng.Uint64(), 10),
		"-batch", strconv.Itoa(batch),
		"-block", crashBlockTime.String(),
		"-claim-interval", crashClaimInterval.String(),
		"-claim-min-idle", crashClaimMinIdle.String(),
		"-ack-flush", ackFlush.String(),
		"-lease-ttl", crashLeaseTTL.String(),
	}
	if os.Getenv("VALKEYSTREAM_TEST_LOG") == "debug" {
		args = append(args, "-v")
	}
	return w, args
}

// startWorker starts w with args and adds it to every worker.
func (r *crashRig) startWorker(w *crashWorker, args []string) {
	r.t.Helper()
	w.start(r.t, r.bin, args)
	r.all = append(r.all, w)
}

// publishRetrying publishes msgs in one call, calling again after a failure
// (20 calls at most, 50 ms apart); failures counts the failed calls.
func publishRetrying(pub message.Publisher, topic string, msgs []*message.Message, failures *int) error {
	for attempt := 1; ; attempt++ {
		err := pub.Publish(topic, msgs...)
		if err == nil {
			return nil
		}
		*failures++
		if attempt == 20 {
			return fmt.Errorf("failed %d times: %w", attempt, err)
		}
		time.Sleep(50 * time.Millisecond) // a retry's pause
	}
}

type crashAudit struct {
	crashRig
	p crashAuditParams

	handled map[string]int // uuid -> complete "handled" lines in all ledgers
	marked  map[string]int // uuid -> "marked" lines in all ledgers (Dedup)
	began   int
	maxDC   int // highest delivery count seen
	kills   crashKillStats
	freezes crashFreezeStats

	transform crashTransformResult // with Transform
}

func runCrashAudit(t *testing.T, p crashAuditParams) *crashAudit {
	a := &crashAudit{
		crashRig: newCrashRig(t, "crash audit", "crash-audit-"+watermill.NewShortUUID(), 0x5eed),
		p:        p,
		handled:  map[string]int{},
		marked:   map[string]int{},
	}
	srv, seed := a.srv, a.seed
	t.Cleanup(a.killAll)
	ctx := context.Background()

	// Publishing runs in the background, paced over PublishFor, while the
	// workers consume and die.
	published := make(chan crashPublishResult, 1)
	var publishedSoFar atomic.Int64
	go func() { published <- a.publish(&publishedSoFar, seed) }()

	slots := make([]*crashWorker, p.Workers)
	for i := range slots {
		slots[i] = a.spawn(fmt.Sprintf("w%d-0", i))
	}

	var (
		sameName, abandoned  int
		lastSlot, earlyKills int
		lastKill             time.Time
		pub                  *crashPublishResult
		giveUp               = time.Now().Add(p.PublishFor + 2*time.Minute)
	)
	// Kill at least Rounds times, and go on until publishing has finished and
	// the backlog is nearly handled, so that the last kill lands on a busy
	// group and the time to drain after it measures recovery, not backlog.
	// Past Rounds, a round kills only if the workers have handled a
	// fiftieth of the messages since the last kill: on a loaded machine
	// kills at the steady pace could outrun the restarted workers' progress.
	handledAtKill := 0
	for round := 0; ; round++ {
		a.readLedgers()
		if pub == nil {
			select {
			case r := <-published:
				pub = &r
			default:
			}
		}
		if a.kills.kills >= p.Rounds && pub != nil && len(pub.uuids)-len(a.handled) <= p.Messages/50 {
			break
		}
		require.True(t, time.Now().Before(giveUp), "still killing after %d rounds: %d published, %d handled",
			round, publishedSoFar.Load(), len(a.handled))
		slot := a.rng.IntN(len(slots))
		early := round > 0 && a.rng.IntN(4) == 0
		if early {
			// Kill the worker that just came back, while it drains its own
			// pending list or reclaims: entries die a second time, and
			// their delivery counts grow past 2.
			slot = lastSlot
			a.sleepRandom(30*time.Millisecond, 250*time.Millisecond)
		} else {
			a.sleepRandom(p.KillEvery[0], p.KillEvery[1])
		}
		if a.kills.kills >= p.Rounds && len(a.handled)-handledAtKill < p.Messages/50 {
			continue // no kill this round: the ledgers are read again after the next pause
		}
		if early {
			earlyKills++
		}
		for _, w := range slots {
			if w.exited() {
				t.Fatalf("worker %s (run %d) exited by itself: %v\n%s", w.name, w.gen, w.waitErr, crashLogTail(w.logPath))
			}
		}

		lastSlot = slot
		victim := slots[slot]
		if f := a.freezes.freezes; f < p.Freezes && a.kills.kills >= (f+1)*p.Rounds/(p.Freezes+1) {
			a.freeze(victim) // it goes on under its name: no restart
			continue
		}
		a.kill(victim)
		lastKill = time.Now()
		handledAtKill = len(a.handled)

		name := victim.name
		if a.rng.IntN(2) == 0 {
			sameName++
		} else {
			// The old name is never used again: a peer has to reclaim what
			// it left pending once it has been idle for ClaimMinIdle.
			abandoned++
			name = fmt.Sprintf("w%d-%d", slot, a.spawns)
		}
		// Sometimes come back at once, sometimes after a while.
		a.sleepRandom(0, 300*time.Millisecond)
		slots[slot] = a.spawn(name)
	}
	require.NoError(t, pub.err, "publishing")

	// Wait until every published message is in a ledger and nothing is
	// pending. The bound is only against a hang.
	want := pub.uuids
	var pending int64
	missing := len(want)
	for deadline := time.Now().Add(90 * time.Second); ; {
		a.readLedgers()
		missing = 0
		for _, id := range want {
			if a.handled[id] == 0 {
				missing++
			}
		}
		info, err := a.admin.XPending(ctx, a.topic, a.group).Result()
		require.NoError(t, err)
		pending = info.Count
		if missing == 0 && pending == 0 {
			break
		}
		for _, w := range slots {
			if w.exited() {
				t.Fatalf("worker %s (run %d) exited by itself: %v\n%s", w.name, w.gen, w.waitErr, crashLogTail(w.logPath))
			}
		}
		if time.Now().After(deadline) {
			a.reportMissing(want, pending)
			t.FailNow()
		}
		time.Sleep(50 * time.Millisecond) // the poll of a wait for the drain
	}
	drained := time.Since(lastKill)

	// A graceful stop of the survivors sends nothing new and leaves nothing
	// pending.
	for _, w := range slots {
		a.stop(w)
	}
	a.readLedgers()
	info, err := a.admin.XPending(ctx, a.topic, a.group).Result()
	require.NoError(t, err)
	require.Zero(t, info.Count, "entries pending after the last workers stopped")

	publishedSet := make(map[string]bool, len(want))
	for _, id := range want {
		publishedSet[id] = true
	}
	duplicated, extra := 0, 0
	for id, n := range a.handled {
		require.True(t, publishedSet[id], "handled message %s was never published", id)
		if n > 1 {
			duplicated++
			extra += n - 1
		}
	}
	require.Len(t, publishedSet, len(want), "the publisher made a UUID twice")
	consumers, err := a.admin.XInfoConsumers(ctx, a.topic, a.group).Result()
	require.NoError(t, err)

	k := a.kills
	t.Logf("crash audit on %s %s: %d messages (%d publish calls failed and were retried), %d workers at a time, %d processes started",
		srv.Name(), srv.Version(), len(want), pub.failures, p.Workers, a.spawns)
	t.Logf("kills: %d (SIGKILL; %d of them shortly after the victim started), %d restarts under the same name, %d names abandoned (%d consumers in the group)",
		k.kills, earlyKills, sameName, abandoned, len(consumers))
	t.Logf("where the kills landed: %d with read entries not yet handled (%d entries), %d inside a handler, %d with handled entries whose Ack had not reached the server (%d entries), %d idle",
		k.queued, k.queuedEntries, k.inHandler, k.unacked, k.unackedEntries, k.idle)
	t.Logf("outcome: every message handled at least once; %d handled more than once (%d extra handlings, %d handler starts in all), max delivery count %d, last kill to fully drained %s",
		duplicated, extra, a.began, a.maxDC, drained.Round(time.Millisecond))
	if p.Dedup {
		a.judgeDedup()
	}
	if p.Delayed > 0 {
		a.judgeDelayed(want)
	}
	if p.Transform {
		a.judgeTransform(want)
	}
	return a
}

// judgeDelayed checks that the workers, killed while they moved delayed
// messages into the stream, moved each exactly once: every published UUID is
// in the stream once, and none is left waiting.
func (a *crashAudit) judgeDelayed(want []string) {
	t := a.t
	ctx := context.Background()
	entries, err := a.admin.XRange(ctx, a.topic, "-", "+").Result()
	require.NoError(t, err)
	inStream := map[string]int{}
	for _, e := range entries {
		id, _ := e.Values[valkeystream.FieldUUID].(string)
		inStream[id]++
	}
	twice := 0
	for _, id := range want {
		if inStream[id] != 1 {
			twice++
		}
	}
	delayedKey, err := valkeystream.DelayedKey(a.topic)
	require.NoError(t, err)
	waiting, err := a.admin.ZCard(ctx, delayedKey).Result()
	require.NoError(t, err)
	t.Logf("delayed messages: %d entries in the stream for %d messages, %d still waiting", len(entries), len(want), waiting)
	if twice > 0 || waiting > 0 || len(entries) != len(want) {
		t.Errorf("%d messages are not in the stream exactly once, %d still wait in %s", twice, waiting, delayedKey)
	}
}

// judgeDedup checks the audit of deduplicating workers: a message may be
// handled to completion more than once only when a kill landed between a
// completed handling and its done mark, so that every extra handling of a
// message is matched by a killed worker whose last handling was that
// message, unmarked.
func (a *crashAudit) judgeDedup() {
	t := a.t
	unmarked := map[string]int{} // uuid -> killed workers that handled it last, without the mark
	windows := 0
	for _, w := range a.all {
		if w.killed && w.lastHandled != "" && !w.lastHandledMarked {
			unmarked[w.lastHandled]++
			windows++
		}
	}
	duplicated, explained, markedTwice := 0, 0, 0
	var unexplained []string
	for id, n := range a.handled {
		if a.marked[id] > 1 {
			markedTwice++
		}
		if n < 2 {
			continue
		}
		duplicated++
		if unmarked[id] >= n-1 {
			explained++
		} else {
			unexplained = append(unexplained, fmt.Sprintf("%s (handled %d times, %d marks, %d unmarked at a kill)", id, n, a.marked[id], unmarked[id]))
		}
	}
	t.Logf("deduplication: %d messages handled to completion more than once; %d of them explained by a kill between the handling and its done mark (%d kills landed after a handling and before its mark was in the ledger, mark written or not), %d marked done twice",
		duplicated, explained, windows, markedTwice)
	sort.Strings(unexplained)
	if len(unexplained) > 0 {
		t.Errorf("%d messages handled more than once without a kill between a handling and its mark: %s",
			len(unexplained), strings.Join(unexplained[:min(len(unexplained), 10)], "; "))
	}
}

type crashPublishResult struct {
	uuids    []string // of every Publish call that returned nil
	failures int      // failed calls, retried
	err      error
}

// publish publishes p.Messages messages in calls of p.Batch, spread over
// about p.PublishFor. A failed call is retried (nothing here disturbs the
// server, so failures are not expected).
func (a *crashAudit) publish(count *atomic.Int64, seed uint64) crashPublishResult {
	client := redis.NewClient(&redis.Options{Addr: a.srv.Addr()})
	defer client.Close()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, testLogger())
	if err != nil {
		return crashPublishResult{err: err}
	}
	rng := rand.New(rand.NewPCG(seed, 0x9b1))
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var res crashPublishResult
	calls := (a.p.Messages + a.p.Batch - 1) / a.p.Batch
	start := time.Now()
	for c := 0; c < calls; c++ {
		// Pace: call c goes out no earlier than its share of PublishFor.
		if d := time.Until(start.Add(a.p.PublishFor * time.Duration(c) / time.Duration(calls))); d > 0 {
			time.Sleep(d) // the time is the scenario: the publish pace
		}
		n := min(a.p.Batch, a.p.Messages-c*a.p.Batch)
		msgs := make([]*message.Message, n)
		for i := range msgs {
			payload := make([]byte, 16+rng.IntN(49)) // 16..64 bytes
			for j := range payload {
				payload[j] = letters[rng.IntN(len(letters))]
			}
			msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
			if rng.Float64() < a.p.Delayed {
				delay.Message(msgs[i], delay.For(time.Duration(rng.Int64N(int64(time.Second)))))
			}
		}
		if err := publishRetrying(pub, a.topic, msgs, &res.failures); err != nil {
			res.err = fmt.Errorf("publish call %d %w", c, err)
			return res
		}
		for _, m := range msgs {
			res.uuids = append(res.uuids, m.UUID)
		}
		count.Add(int64(n))
	}
	return res
}

// spawn starts a worker process under the consumer name.
func (a *crashAudit) spawn(name string) *crashWorker {
	a.t.Helper()
	w, args := a.newWorker(name)
	args = append(args, "-delay-prob", "0.4", "-delay-max", "4ms")
	if a.p.Dedup {
		args = append(args, "-dedup", "-running-ttl", crashDedupRunningTTL.String())
	}
	args = append(args, a.transformArgs()...)
	if os.Getenv("VALKEYSTREAM_CRASH_BASELINE_VERBS") != "" {
		// To compare the paths on a server with newer verbs
		// (docs/server-verbs.md).
		args = append(args, "-baseline-verbs")
	}
	a.startWorker(w, args)
	return w
}

// start starts the worker process bin with args, its output to its log
// file and its standard input a pipe the test holds (closing it stops the
// worker cleanly).
func (w *crashWorker) start(t *testing.T, bin string, args []string) {
	t.Helper()
	logFile, err := os.Create(w.logPath)
	require.NoError(t, err)
	defer logFile.Close()
	stdinR, stdinW, err := os.Pipe()
	require.NoError(t, err)
	defer stdinR.Close()
	w.stdin = stdinW
	w.cmd = exec.Command(bin, args...)
	w.cmd.Stdin = stdinR
	w.cmd.Stdout = logFile
	w.cmd.Stderr = logFile
	require.NoError(t, w.cmd.Start(), "starting the worker")
	go func() {
		w.waitErr = w.cmd.Wait()
		close(w.done)
	}()
}

// kill sends SIGKILL to the worker, waits until it is gone, and classifies
// what it left pending.
func (a *crashAudit) kill(w *crashWorker) {
	t := a.t
	t.Helper()
	require.NoError(t, w.cmd.Process.Kill())
	<-w.done
	w.killed = true
	_ = w.stdin.Close()
	a.readLedger(w)

	// The run's own name: a run that came back while the killed one's
	// lease had not lapsed holds a name derived from w.name.
	consumer := a.member(w)
	if consumer == "" {
		consumer = w.name // killed before it logged its name
	}
	pend, err := a.admin.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: a.topic, Group: a.group, Consumer: consumer, Start: "-", End: "+", Count: 1 << 20,
	}).Result()
	if redis.HasErrorPrefix(err, "NOGROUP") {
		// Killed before any worker's Subscribe created the group (a
		// loaded machine starts the workers slowly): nothing is pending.
		err = nil
	}
	require.NoError(t, err)
	var queued, inHandler, unacked int
	for _, e := range pend {
		switch {
		case w.ended[e.ID]:
			unacked++
		case w.began[e.ID]:
			inHandler++
		default:
			queued++ // read (by this run or an earlier one of the name), not begun here
		}
	}
	k := &a.kills
	k.kills++
	if queued > 0 {
		k.queued++
		k.queuedEntries += queued
	}
	if inHandler > 0 {
		k.inHandler++
	}
	if unacked > 0 {
		k.unacked++
		k.unackedEntries += unacked
	}
	if len(pend) == 0 {
		k.idle++
	}
}

// stop asks the worker to stop gracefully and waits for it.
func (r *crashRig) stop(w *crashWorker) { w.stop(r.t) }

// killAll kills every worker still running (on failure paths).
func (r *crashRig) killAll() { killWorkers(r.all) }

// stop asks w to stop gracefully (its stdin closes) and waits for it.
func (w *crashWorker) stop(t *testing.T) {
	t.Helper()
	_ = w.stdin.Close()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker %s (run %d) did not stop within 30 s of its stdin closing\n%s", w.name, w.gen, crashLogTail(w.logPath))
	}
	require.NoError(t, w.waitErr, "worker %s (run %d) did not stop cleanly\n%s", w.name, w.gen, crashLogTail(w.logPath))
}

// killWorkers kills every worker of all still running.
func killWorkers(all []*crashWorker) {
	for _, w := range all {
		if !w.exited() {
			_ = w.cmd.Process.Kill()
			<-w.done
		}
		_ = w.stdin.Close()
	}
}

func (a *crashAudit) readLedgers() {
	for _, w := range a.all {
		a.readLedger(w)
	}
}

func (a *crashAudit) readLedger(w *crashWorker) {
	recs, err := w.ledger.Read()
	require.NoError(a.t, err)
	for _, r := range recs {
		w.lastEntry = r.EntryID
		switch r.Kind {
		case audit.Began:
			a.began++
			w.began[r.EntryID] = true
		case audit.Handled:
			a.handled[r.UUID]++
			w.ended[r.EntryID] = true
			a.maxDC = max(a.maxDC, r.Count)
			w.lastHandled, w.lastHandledMarked = r.UUID, false
		case audit.Marked:
			a.marked[r.UUID]++
			if r.UUID == w.lastHandled {
				w.lastHandledMarked = true
			}
		}
	}
}

// reportMissing explains a failed drain: which messages never reached a
// ledger, and what the server still holds.
func (a *crashAudit) reportMissing(want []string, pending int64) {
	t := a.t
	var missing []string
	for _, id := range want {
		if a.handled[id] == 0 {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	shown := missing[:min(len(missing), 20)]
	t.Errorf("not drained: %d of %d published messages never handled (first: %s), %d entries pending (seed %d)",
		len(missing), len(want), strings.Join(shown, " "), pending, a.seed)
	ctx := context.Background()
	// Where the first missing messages are: their entries, and who holds
	// them.
	if entries, err := a.admin.XRange(ctx, a.topic, "-", "+").Result(); err == nil {
		byUUID := map[string][]string{}
		for _, e := range entries {
			if id, ok := e.Values[valkeystream.FieldUUID].(string); ok {
				byUUID[id] = append(byUUID[id], e.ID)
			}
		}
		for _, id := range missing[:min(len(missing), 5)] {
			for _, entryID := range byUUID[id] {
				p, _ := a.admin.XPendingExt(ctx, &redis.XPendingExtArgs{
					Stream: a.topic, Group: a.group, Start: entryID, End: entryID, Count: 1}).Result()
				t.Logf("missing message %s: entry %s, pending %+v", id, entryID, p)
			}
			if len(byUUID[id]) == 0 {
				t.Logf("missing message %s: no entry in the stream", id)
			}
		}
	}
	if groups, err := a.admin.XInfoGroups(ctx, a.topic).Result(); err == nil {
		t.Logf("groups: %+v", groups)
	}
	if consumers, err := a.admin.XInfoConsumers(ctx, a.topic, a.group).Result(); err == nil {
		for _, c := range consumers {
			if c.Pending > 0 {
				t.Logf("consumer %+v", c)
			}
		}
	}
	for _, w := range a.all {
		if !w.exited() {
			t.Logf("running worker %s (run %d) log:\n%s", w.name, w.gen, crashLogTail(w.logPath))
		}
	}
}

// sleepRandom sleeps a uniformly random time in [lo, hi].
func (r *crashRig) sleepRandom(lo, hi time.Duration) {
	if hi <= lo {
		time.Sleep(lo) // the time is the scenario: a random pause
		return
	}
	time.Sleep(lo + time.Duration(r.rng.Int64N(int64(hi-lo)+1))) // the time is the scenario: a random pause
}

// crashAdminClient returns the client the test inspects the group with. It
// waits long for replies: with the append-only file fsynced on every write, a
// busy disk can hold the whole server for seconds.
func crashAdminClient(t *testing.T, srv *testserver.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// buildCrashWorker builds internal/crashworker into a temporary directory.
// The worker is built without -race even when the test runs with it: it is a
// plain consumer, and a faster one lets more kills land mid-stream.
func buildCrashWorker(t *testing.T) string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		p, lookErr := exec.LookPath("go")
		if lookErr != nil {
			t.Skipf("the crash audit builds its worker process with the go command, which is neither in GOROOT (%s) nor on PATH", goBin)
		}
		goBin = p
	}
	out := filepath.Join(t.TempDir(), "crashworker")
	if runtime.GOOS == "windows" {
		out += ".exe"
	}
	start := time.Now()
	cmd := exec.Command(goBin, "build", "-o", out, "./internal/crashworker")
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the crash worker: %v\n%s", err, output)
	}
	t.Logf("built the crash worker in %s", time.Since(start).Round(time.Millisecond))
	return out
}

// tail returns the last lines of a worker's log.
func crashLogTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}
