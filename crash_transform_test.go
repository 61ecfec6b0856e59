package valkeystream_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The transform crash audits: the workers (internal/crashworker
// -transform-to) are one stage of a pipeline, input topic -> router handler
// -> output topic, each input turned into one output that carries the
// input's UUID in metadata key "input". The kills of TestCrashAudit land
// inside the handler, between the handler and the output's write, and
// between the output and the input's Ack. A few rounds freeze a worker
// inside a handling instead (SIGSTOP past ClaimMinIdle, then SIGCONT): a
// peer takes the entry and handles it, and the resumed worker finishes a
// delivery that is no longer its own, which only the fencing of the step
// (consumer and delivery count) keeps from writing a second output; a
// SIGKILL alone never tests the fencing, as a dead worker sends nothing.
// At the end the audit asks the server, not the ledgers: every input
// acknowledged (nothing pending, lag 0) and, per input, how many outputs
// the output stream holds.
//
// With ExactlyOnce's middleware the output and the Ack are one step, so
// every input has exactly one output however often it was handled. Without
// it (the control) a kill between the router's publish and the Ack that
// follows, or a frozen handling resumed, publishes the output again: at
// least one output per input, some with two. The control's duplicates depend on where the
// kills land, so the CI-sized control only logs them; the full-size run
// (crash_transform_stress_test.go, go test -tags stress) asserts them.

// A freeze (crashAuditParams.Freezes) holds a worker stopped for longer than
// a peer needs to take its entries: ClaimMinIdle since the last hold beat,
// plus a reclaim pass.
var crashFreezeFor = [2]time.Duration{crashClaimMinIdle + 700*time.Millisecond, crashClaimMinIdle + 1500*time.Millisecond}

// crashFreezeStats counts the freezes of an audit.
type crashFreezeStats struct {
	freezes   int // workers stopped and resumed
	inHandler int // of them stopped with a handling begun and its entry still pending to them
	taken     int // of those, whose entry a peer had taken when they resumed
	of        map[*crashWorker]int
}

// freeze stops the worker with SIGSTOP inside a handling (stopping and
// resuming it at once until its last ledger line is of an entry still
// pending to it, a few tries), holds it stopped for crashFreezeFor, and
// resumes it with SIGCONT: the handling it resumes is of a delivery that a
// peer has taken meanwhile, the "zombie" that ExactlyOnce's fencing is for.
func (a *crashAudit) freeze(w *crashWorker) {
	t := a.t
	t.Helper()
	if !crashCanFreeze {
		t.Log("no SIGSTOP on this system: the freeze is left out")
		return
	}
	ctx := context.Background()
	pendingTo := func(entry string) bool {
		if entry == "" {
			return false
		}
		p, err := a.admin.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: a.topic, Group: a.group, Start: entry, End: entry, Count: 1}).Result()
		require.NoError(t, err)
		return len(p) == 1 && p[0].Consumer == w.name
	}
	var entry string
	for try := 0; ; try++ {
		require.NoError(t, crashStop(w.cmd.Process))
		a.readLedger(w)
		if pendingTo(w.lastEntry) {
			entry = w.lastEntry
			break
		}
		if try == 100 {
			break // frozen between handlings
		}
		require.NoError(t, crashCont(w.cmd.Process))
		a.sleepRandom(time.Millisecond, 5*time.Millisecond)
	}
	a.freezes.freezes++
	if a.freezes.of == nil {
		a.freezes.of = map[*crashWorker]int{}
	}
	a.freezes.of[w]++
	a.sleepRandom(crashFreezeFor[0], crashFreezeFor[1])
	if entry != "" {
		a.freezes.inHandler++
		if !pendingTo(entry) {
			a.freezes.taken++
		}
	}
	require.NoError(t, crashCont(w.cmd.Process))
}

// crashTransformParams is the CI size of a transform audit: well under a
// minute per server for both variants together.
func crashTransformParams(exactlyOnce bool) crashAuditParams {
	return crashAuditParams{
		Messages:    3000,
		Workers:     3,
		Rounds:      5,
		KillEvery:   [2]time.Duration{150 * time.Millisecond, 600 * time.Millisecond},
		PublishFor:  5 * time.Second,
		Batch:       20,
		Transform:   true,
		ExactlyOnce: exactlyOnce,
		Freezes:     2,
	}
}

// TestCrashAuditTransformExactlyOnce kills transform stages under
// ExactlyOnce: no input is lost, none is left without an output, and none
// has more than one.
func TestCrashAuditTransformExactlyOnce(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	runCrashTransform(t, crashTransformParams(true))
}

// TestCrashAuditTransformAtLeastOnce is the control of
// TestCrashAuditTransformExactlyOnce: the same stages without ExactlyOnce.
// No input is lost or left without an output; the inputs with more than one
// output are counted and logged, not asserted.
func TestCrashAuditTransformAtLeastOnce(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	runCrashTransform(t, crashTransformParams(false))
}

// crashTransformResult is what a transform audit found on the server.
type crashTransformResult struct {
	inputs       int // published inputs
	lost         int // inputs not once in the input stream, or not acknowledged
	noOutput     int // inputs without an output
	multiOutput  int // inputs with more than one output
	extraOutputs int // outputs beyond the first of an input
	stray        int // outputs of no published input
	handledTwice int // inputs handled to completion more than once (ledgers)
	superseded   int // ExactlyOnce steps that found their delivery taken (worker logs)
}

// runCrashTransform runs one transform audit and returns what it found.
func runCrashTransform(t *testing.T, p crashAuditParams) crashTransformResult {
	start := time.Now()
	a := runCrashAudit(t, p)
	r := a.transform
	mode := "control (no ExactlyOnce)"
	if p.ExactlyOnce {
		mode = "ExactlyOnce"
	}
	f := a.freezes
	t.Logf("transform audit, %s, on %s %s: %d inputs, %d kills, %d freezes (%d inside a handling, %d of whose entries a peer took meanwhile), %d lost, %d with no output, %d with more than one output (%d extra outputs), %d handled more than once (ledgers), %d steps superseded (worker logs), %d stray outputs; wall time %s",
		mode, a.srv.Name(), a.srv.Version(), r.inputs, a.kills.kills, f.freezes, f.inHandler, f.taken, r.lost, r.noOutput, r.multiOutput, r.extraOutputs,
		r.handledTwice, r.superseded, r.stray, time.Since(start).Round(100*time.Millisecond))
	return r
}

// transformArgs are the worker flags of a transform audit.
func (a *crashAudit) transformArgs() []string {
	if !a.p.Transform {
		return nil
	}
	args := []string{"-transform-to", a.outputTopic()}
	if a.p.ExactlyOnce {
		args = append(args, "-exactly-once")
	}
	return args
}

func (a *crashAudit) outputTopic() string { return a.topic + "-out" }

// judgeTransform checks, on the server, the input stream and its group
// (every published input in it once, acknowledged, nothing left unread)
// and counts the outputs of each input in the output stream.
func (a *crashAudit) judgeTransform(want []string) {
	t := a.t
	ctx := context.Background()
	r := crashTransformResult{inputs: len(want)}
	for _, n := range a.handled {
		if n > 1 {
			r.handledTwice++
		}
	}

	// The inputs: once each in the stream, none pending, none unread.
	inputEntry := map[string]string{} // uuid -> entry id
	inStream := map[string]int{}
	for _, e := range crashStreamEntries(t, a.admin, a.topic) {
		id, _ := e.Values[valkeystream.FieldUUID].(string)
		inStream[id]++
		inputEntry[id] = e.ID
	}
	for _, id := range want {
		if inStream[id] != 1 {
			r.lost++
		}
	}
	info, err := a.admin.XPending(ctx, a.topic, a.group).Result()
	require.NoError(t, err)
	stream, err := a.admin.XInfoStream(ctx, a.topic).Result()
	require.NoError(t, err)
	groups, err := a.admin.XInfoGroups(ctx, a.topic).Result()
	require.NoError(t, err)
	var group *redis.XInfoGroup
	for i := range groups {
		if groups[i].Name == a.group {
			group = &groups[i]
		}
	}
	require.NotNil(t, group, "group %q of %s", a.group, a.topic)
	if info.Count != 0 || group.LastDeliveredID != stream.LastGeneratedID || group.Lag > 0 {
		// Every input counts as lost: the server does not say which.
		r.lost = len(want)
		t.Errorf("inputs not all acknowledged: %d pending, last delivered %s of last %s, lag %d",
			info.Count, group.LastDeliveredID, stream.LastGeneratedID, group.Lag)
	}

	// The outputs, per input.
	outputs := map[string][]string{} // input uuid -> output entry ids
	for _, e := range crashStreamEntries(t, a.admin, a.outputTopic()) {
		msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(e.Values)
		require.NoError(t, err, "output entry %s", e.ID)
		in := msg.Metadata.Get("input")
		outputs[in] = append(outputs[in], e.ID)
	}
	published := make(map[string]bool, len(want))
	for _, id := range want {
		published[id] = true
		switch n := len(outputs[id]); {
		case n == 0:
			r.noOutput++
		case n > 1:
			r.multiOutput++
			r.extraOutputs += n - 1
		}
	}
	for in, ids := range outputs {
		if !published[in] {
			r.stray += len(ids)
		}
	}
	for _, w := range a.all {
		data, err := os.ReadFile(w.logPath)
		require.NoError(t, err)
		r.superseded += strings.Count(string(data), "The input is no longer this delivery's")
	}
	a.transform = r

	if r.noOutput > 0 || r.stray > 0 {
		t.Errorf("%d inputs without an output, %d outputs of no published input", r.noOutput, r.stray)
	}
	if r.lost > 0 {
		t.Errorf("%d inputs lost: not once in the input stream, or not acknowledged", r.lost)
	}
	if a.p.ExactlyOnce && r.multiOutput > 0 {
		t.Errorf("ExactlyOnce: %d inputs have more than one output (%d extra outputs); seed %d", r.multiOutput, r.extraOutputs, a.seed)
		a.explainMultiOutput(want, inputEntry, outputs)
	}
}

// explainMultiOutput logs, for the first inputs with more than one output,
// their entries and every ledger line of them: which workers handled them,
// with which delivery counts, and which of those workers were killed.
func (a *crashAudit) explainMultiOutput(want []string, inputEntry map[string]string, outputs map[string][]string) {
	t := a.t
	var multi []string
	for _, id := range want {
		if len(outputs[id]) > 1 {
			multi = append(multi, id)
		}
	}
	sort.Strings(multi)
	multi = multi[:min(len(multi), 5)]
	lines := map[string][]string{}
	for _, w := range a.all {
		recs, err := audit.NewReader(w.ledger.Path()).Read()
		require.NoError(t, err)
		for _, rec := range recs {
			for _, id := range multi {
				if rec.UUID == id {
					lines[id] = append(lines[id], fmt.Sprintf("%s run %d (killed %t, frozen %d times): %c entry %s count %d",
						w.name, w.gen, w.killed, a.freezes.of[w], rec.Kind, rec.EntryID, rec.Count))
				}
			}
		}
	}
	for _, id := range multi {
		t.Logf("input %s (entry %s): outputs %s; ledgers:\n  %s", id, inputEntry[id],
			strings.Join(outputs[id], " "), strings.Join(lines[id], "\n  "))
	}
}

// crashStreamEntries reads every entry of the stream at key, in pages. A
// page starts at the last entry of the one before (no exclusive ranges
// before Redis 6.2), which is dropped.
func crashStreamEntries(t *testing.T, c redis.UniversalClient, key string) []redis.XMessage {
	t.Helper()
	const page = 5000
	var all []redis.XMessage
	for start := "-"; ; {
		entries, err := c.XRangeN(context.Background(), key, start, "+", page).Result()
		require.NoError(t, err, "reading %s", key)
		if start != "-" && len(entries) > 0 && entries[0].ID == start {
			entries = entries[1:]
		}
		all = append(all, entries...)
		if len(entries) < page-1 {
			return all
		}
		start = all[len(all)-1].ID
	}
}
