package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/examples/internal/e2e"
)

const (
	// events is how many events the test publishes, over accounts accounts.
	events   = 3000
	accounts = 50
	// kills is how many times the test SIGKILLs a worker.
	kills = 6
	// testOwnerTTL is the workers' -owner-ttl: the partitions of a killed
	// worker are taken over this long after its death.
	testOwnerTTL = time.Second
	// handledBeforeKill is how many events a worker applies before it is
	// killed, while the test keeps about backlog events published ahead of
	// the workers, in batches of batch.
	handledBeforeKill = 50
	backlog           = 200
	batch             = 50
	// settleTimeout bounds each wait for the workers.
	settleTimeout = 30 * time.Second
)

// Three workers apply 3000 events to 50 accounts while one of them is
// SIGKILLed six times, each time while it works through its partitions'
// backlog, and restarted. Every balance is the sum of its events; every
// event was applied once and has one BalanceChanged output, and each
// account's outputs carry its running balance in the events' order;
// nothing is left pending.
func TestLedger(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := filepath.Join(t.TempDir(), "ledger")
	e2e.Build(ctx, t, bin, ".", e2e.RaceEnabled)
	srv := e2e.StartServer(ctx, t)
	t.Logf("server: %s at %s", srv.About, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client:     client,
		Partitions: map[string]int{eventsTopic: partitions},
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })

	// The events, and what each account's balance is after each of its
	// events, in publish order.
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := make([]*message.Message, events)
	account := map[string]string{} // by event id
	running := map[string][]int64{}
	for i := range msgs {
		e := Event{Account: fmt.Sprintf("acct-%02d", rng.IntN(accounts)), Kind: deposit, Amount: 1 + rng.Int64N(10_000)}
		if rng.IntN(3) == 0 {
			e.Kind = withdraw
		}
		delta, err := e.delta()
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("ev-%04d", i)
		if msgs[i], err = eventMessage(id, e); err != nil {
			t.Fatal(err)
		}
		account[id] = e.Account
		r := running[e.Account]
		before := int64(0)
		if len(r) > 0 {
			before = r[len(r)-1]
		}
		running[e.Account] = append(r, before+delta)
	}

	out := &outputs{client: client, byEvent: map[string]int{}, byWorker: map[string]int{}, balances: map[string][]int64{}}
	victim := startWorker(ctx, t, bin, srv.Addr, "w1.0", byFlags)
	steady := []*worker{
		startWorker(ctx, t, bin, srv.Addr, "w2", byFlags),
		startWorker(ctx, t, bin, srv.Addr, "w3", byEnvironment),
	}
	workers := append([]*worker{victim}, steady...)

	// The events go out in batches, kept about backlog ahead of the
	// workers, while the victim is killed once it has applied some since
	// its start (so it dies with its partitions' entries in hand) and
	// restarted under a new name (as a new pod would be), by flags or by
	// environment in turn. Its partitions wait testOwnerTTL for their next
	// owner, which applies the entries the killed one held first. The
	// events left after the last kill go out at once.
	published := 0
	publish := func(n int) {
		n = min(n, events-published)
		if err := pub.Publish(eventsTopic, msgs[published:published+n]...); err != nil {
			t.Fatalf("publishing events %d to %d: %v", published, published+n, err)
		}
		published += n
	}
	for k := range kills {
		waitFor(ctx, t, "worker "+victim.name+" to apply events", func() (bool, string) {
			victim.CheckRunning(t)
			out.read(ctx, t)
			if published-len(out.byEvent) < backlog && published < events-backlog {
				publish(batch)
			}
			n := out.byWorker[victim.name]
			return n >= handledBeforeKill, fmt.Sprintf("%d applied by %s, %d of %d published in all", n, victim.name, len(out.byEvent), published)
		})
		victim.Kill(t)
		victim = startWorker(ctx, t, bin, srv.Addr, fmt.Sprintf("w1.%d", k+1), k%2 == 0)
		workers = append(workers, victim)
	}
	t.Logf("%d events published during the kills, %d after", published, events-published)
	publish(events - published)

	deadStream := eventsTopic + valkeystream.DefaultDeadLetterSuffix
	streams, err := valkeystream.PartitionStreams(eventsTopic, partitions)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "every event applied and nothing pending", func() (bool, string) {
		out.read(ctx, t)
		pending := e2e.PendingEntries(ctx, t, client, streams...)
		return len(out.byEvent) == events && pending == 0,
			fmt.Sprintf("%d of %d events have an output, %d pending", len(out.byEvent), events, pending)
	})
	for _, w := range append([]*worker{victim}, steady...) {
		w.Stop(t, settleTimeout)
	}
	out.read(ctx, t) // anything written since, which would be a second output
	for _, w := range workers {
		if strings.Contains(w.Output.String(), "WARNING: DATA RACE") {
			t.Errorf("worker %s reported a data race:\n%s", w.name, w.Output.String())
		}
	}
	t.Logf("events applied by worker: %v; %d of them delivered more than once", out.byWorker, out.again)
	if out.again == 0 {
		t.Errorf("no event was delivered twice: the kills took none in hand")
	}

	// One output per event, and each account's in the events' order.
	for id, n := range out.byEvent {
		if _, ok := account[id]; !ok {
			t.Errorf("an output for event %s, which was never published", id)
		} else if n != 1 {
			t.Errorf("event %s: %d outputs, want 1", id, n)
		}
	}
	for acct, want := range running {
		if got := out.balances[acct]; !slices.Equal(got, want) {
			t.Errorf("account %s: the outputs' balances are %v, want the running sums %v", acct, got, want)
		}
	}
	// The state: each balance the sum of its events, each event applied
	// once.
	for acct, r := range running {
		want := r[len(r)-1]
		got, err := client.Get(ctx, balanceKey(acct)).Int64()
		if err != nil || got != want {
			t.Errorf("balance of %s: got %d (%v), want %d", acct, got, err, want)
		}
		applied, err := client.HGetAll(ctx, appliedKey(acct)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(applied) != len(r) {
			t.Errorf("account %s: %d events recorded as applied, want %d", acct, len(applied), len(r))
		}
		for id, times := range applied {
			if account[id] != acct || times != "1" {
				t.Errorf("account %s: event %s (of account %q) applied %s times, want once", acct, id, account[id], times)
			}
		}
	}
	if n := client.Exists(ctx, deadStream).Val(); n != 0 {
		t.Errorf("dead letters in %s: %v", deadStream, client.XRange(ctx, deadStream, "-", "+").Val())
	}
}

// outputs tallies the BalanceChanged outputs, read from changedTopic in
// stream order.
type outputs struct {
	client   *redis.Client
	last     string             // the last entry id read
	byEvent  map[string]int     // outputs by event id
	byWorker map[string]int     // outputs by the consumer that applied the event
	balances map[string][]int64 // by account, in stream order
	again    int                // outputs of events delivered more than once
}

// read tallies the outputs written since the last read.
func (o *outputs) read(ctx context.Context, t *testing.T) {
	t.Helper()
	from := "-"
	if o.last != "" {
		from = "(" + o.last
	}
	entries, err := o.client.XRange(ctx, changedTopic, from, "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", changedTopic, err)
	}
	for _, e := range entries {
		payload, _ := e.Values[valkeystream.FieldPayload].(string)
		var c BalanceChanged
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			t.Fatalf("output %s: %v (%q)", e.ID, err, payload)
		}
		o.byEvent[c.EventID]++
		o.byWorker[c.HandledBy]++
		o.balances[c.Account] = append(o.balances[c.Account], c.Balance)
		if c.Delivery > 1 {
			o.again++
		}
		o.last = e.ID
	}
}

// worker is a ledger worker running as a child process.
type worker struct {
	*e2e.Process
	name string
}

// How startWorker gives the worker its server address and consumer name.
const (
	byFlags       = false // -addr and -consumer
	byEnvironment = true  // VALKEYSTREAM_ADDR and LEDGER_CONSUMER
)

// startWorker starts the ledger binary as consumer name against the
// server at addr, and waits for its start line.
func startWorker(ctx context.Context, t *testing.T, bin, addr, name string, byEnv bool) *worker {
	t.Helper()
	args := []string{"-publish", "0", "-owner-ttl", testOwnerTTL.String()}
	cmd := e2e.Command(bin, args, byEnv,
		e2e.Setting{Flag: "-addr", Env: "VALKEYSTREAM_ADDR", Value: addr},
		e2e.Setting{Flag: "-consumer", Env: "LEDGER_CONSUMER", Value: name})
	w := &worker{Process: e2e.StartProcess(t, "worker "+name, cmd), name: name}
	line := "worker " + name + ": "
	waitFor(ctx, t, "worker "+name+" to start", func() (bool, string) {
		w.CheckRunning(t)
		return strings.Contains(w.Output.String(), line), "no line " + strconv.Quote(line)
	})
	return w
}

// waitFor polls cond every 20ms until it holds, failing the test with
// cond's last description after settleTimeout.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	e2e.WaitFor(ctx, t, what, settleTimeout, 20*time.Millisecond, cond)
}
