package partition

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The timings of the driver tests: short, so that moves take a few
// hundred milliseconds.
const (
	testBeat = 100 * time.Millisecond
	testTTL  = 3 * time.Second // far above a loaded machine's stalls: no test here loses an ownership it renews
)

// driverEnv is a private server, the layout of a topic "t" of n
// partitions, and the log of every delivery of group "g", in the order
// the handlers took them.
type driverEnv struct {
	client *redis.Client
	layout *Layout

	mu   sync.Mutex
	next []int        // the sequence number of each partition's next entry
	log  [][]delivery // each partition's deliveries
}

// delivery is one message a handler took.
type delivery struct {
	member string
	seq    int
	id     string
	at     time.Time
}

func newDriverEnv(t *testing.T, n int) *driverEnv {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: testserver.Start(t).Addr(), PoolSize: 4 * n})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewLayout("t", n)
	require.NoError(t, err)
	return &driverEnv{client: client, layout: l, next: make([]int, n), log: make([][]delivery, n)}
}

// add appends k entries to every partition, each with its partition and
// sequence number.
func (e *driverEnv) add(t *testing.T, k int) {
	pipe := e.client.Pipeline()
	e.mu.Lock()
	for p := range e.next {
		for range k {
			pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: e.layout.Stream(p), Values: []any{"p", p, "seq", e.next[p]}})
			e.next[p]++
		}
	}
	e.mu.Unlock()
	_, err := pipe.Exec(context.Background())
	assert.NoError(t, err) // also on the publishing goroutine
}

// publish adds an entry to every partition every interval until the test
// calls the function returned, which returns once it has stopped.
func (e *driverEnv) publish(t *testing.T, interval time.Duration) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				e.add(t, 1)
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() { close(done) })
		<-ended
	}
	t.Cleanup(stop)
	return stop
}

// published returns the number of entries of each partition.
func (e *driverEnv) published() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.next...)
}

// delivered returns each partition's deliveries so far.
func (e *driverEnv) delivered() [][]delivery {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]delivery, len(e.log))
	for p, ds := range e.log {
		out[p] = append([]delivery(nil), ds...)
	}
	return out
}

// owners returns how many partitions each member's owner records hold.
func (e *driverEnv) owners(t *testing.T) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for p := range e.layout.N() {
		record, err := e.client.Get(context.Background(), e.layout.Keys(p, "g").Owner).Result()
		if err == redis.Nil {
			continue
		}
		require.NoError(t, err)
		tok, err := parseToken(record)
		require.NoError(t, err)
		counts[tok.Member]++
	}
	return counts
}

// waitOwners waits until the owner records hold want, and returns how long
// that took.
func (e *driverEnv) waitOwners(t *testing.T, want map[string]int) time.Duration {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, e.owners(t)) },
		20*time.Second, 5*time.Millisecond, "the owner records never held %v", want)
	return time.Since(start)
}

// waitDelivered waits until every entry published was delivered.
func (e *driverEnv) waitDelivered(t *testing.T) {
	t.Helper()
	want := e.published()
	require.Eventually(t, func() bool {
		for p, ds := range e.delivered() {
			if len(ds) < want[p] {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "not every entry was delivered")
}

// lapses subscribes to the server's expiry events, and returns a function
// that waits until the owner record of partition p has expired (lapsed,
// rather than been deleted or overwritten) since the call.
func (e *driverEnv) lapses(t *testing.T) (lapsed func(p int)) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.client.ConfigSet(ctx, "notify-keyspace-events", "Ex").Err())
	ps := e.client.Subscribe(ctx, "__keyevent@0__:expired")
	t.Cleanup(func() { _ = ps.Close() })
	_, err := ps.Receive(ctx) // the subscription's confirmation: events from now on are seen
	require.NoError(t, err)
	ch := ps.Channel()
	expired := map[string]bool{}
	return func(p int) {
		t.Helper()
		key := e.layout.Keys(p, "g").Owner
		deadline := time.After(20 * time.Second)
		for !expired[key] {
			select {
			case m := <-ch:
				expired[m.Payload] = true
			case <-deadline:
				t.Fatalf("partition %d: its owner record %s never expired: it was taken over before it lapsed", p, key)
			}
		}
	}
}

// waitHandling waits until member has handled an entry of each of
// partitions that was not in the log when the call began: its loops there
// are at work.
func (e *driverEnv) waitHandling(t *testing.T, member string, partitions []int) {
	t.Helper()
	from := e.delivered()
	require.Eventually(t, func() bool {
		now := e.delivered()
		for _, p := range partitions {
			if !slices.ContainsFunc(now[p][len(from[p]):], func(d delivery) bool { return d.member == member }) {
				return false
			}
		}
		return true
	}, 20*time.Second, 5*time.Millisecond, "%s handled nothing new of partitions %v", member, partitions)
}

// assertOnceInOrder checks that each partition's entries were delivered
// once each, in stream order, whoever handled them.
func (e *driverEnv) assertOnceInOrder(t *testing.T) {
	t.Helper()
	want := e.published()
	for p, ds := range e.delivered() {
		seqs := make([]int, len(ds))
		for i, d := range ds {
			seqs[i] = d.seq
		}
		wantSeqs := make([]int, want[p])
		for i := range wantSeqs {
			wantSeqs[i] = i
		}
		assert.Equal(t, wantSeqs, seqs, "partition %d: got these sequence numbers, want each once in order", p)
	}
}

// member is one subscription under test: a driver, the loop of each
// partition it owns, and one handler for the messages of all of them.
type member struct {
	name   string
	d      *Driver
	cancel context.CancelFunc
	ran    chan struct{} // closed when Run returned
	loops  sync.WaitGroup
	work   sync.WaitGroup // the handlers at work

	mu     sync.Mutex
	frozen bool // the handler takes no more messages
}

// loopTemplate is the loop config of every partition's loop: Acks sent
// at once, batches of 10, a short block.
var loopTemplate = loop.Config{
	BatchSize:        10,
	PrefetchWindow:   -1,
	ReadAheadBytes:   -1,
	BlockTime:        100 * time.Millisecond,
	ClaimMinIdle:     3 * time.Second,
	AckFlushInterval: -1,
	CloseGrace:       2 * time.Second,
	NackDelay:        func(int64) time.Duration { return 0 },
}

// start runs a driver named name on e, whose handler logs each delivery and
// acknowledges it.
func (e *driverEnv) start(t *testing.T, name string) *member {
	t.Helper()
	m := &member{name: name, ran: make(chan struct{})}
	msgs := make(chan *message.Message) // shared by the partitions' loops
	d, err := NewDriver(e.client, e.layout, DriverConfig{
		Group: "g", Member: name, Start: "0",
		Beat: testBeat, OwnerTTL: testTTL, MemberTTL: testTTL, HandOverPage: 3,
		Run: func(ctx context.Context, p Owned) { m.runLoop(ctx, p, msgs) },
	})
	require.NoError(t, err)
	m.d = d
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.ran)
		assert.NoError(t, d.Run(ctx))
	}()
	go m.handle(e, msgs)
	t.Cleanup(func() {
		cancel()
		<-m.ran
		m.loops.Wait() // the loops of a halted driver end with ctx
		m.work.Wait()
	})
	return m
}

// runLoop runs the loop of an owned partition and forwards its messages to
// msgs, until ctx ends.
func (m *member) runLoop(ctx context.Context, p Owned, msgs chan<- *message.Message) {
	m.loops.Add(1)
	defer m.loops.Done()
	deps := loop.Deps{
		Server:   p.Server,
		Counters: &loop.Counters{},
		Logger:   watermill.NopLogger{},
		Handling: loop.Handling{
			Decode: func(e loop.Entry) (*message.Message, error) {
				msg := message.NewMessage(e.ID, nil)
				msg.Metadata.Set("p", fmt.Sprint(e.Fields["p"]))
				msg.Metadata.Set("seq", fmt.Sprint(e.Fields["seq"]))
				return msg, nil
			},
			DeadLetter: func(context.Context, loop.Entry, int64, error) error { return nil },
		},
		Reopen: func(ctx context.Context) error { return p.Ownership.Partition().CreateGroup(ctx, p.Start) },
	}
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	out := make(chan *message.Message)
	g := loop.NewGroup(p.LoopConfig(loopTemplate), deps, out)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		g.Run(lctx)
	}()
	HandOver{Fence: p.Fence, Out: msgs, Stop: stop}.Run(lctx, lctx, out)
	<-ended
}

// handlingTime is how long a handler works on a message: the in-flight
// work a partition's release must wait for.
const handlingTime = 120 * time.Millisecond

// handle handles each message on a goroutine of its own (one at a time per
// partition, as the loops deliver them): it works for handlingTime, then
// logs the delivery and acknowledges it, unless the member is frozen
// meanwhile.
func (m *member) handle(e *driverEnv, msgs <-chan *message.Message) {
	for {
		select {
		case msg := <-msgs:
			if m.isFrozen() {
				return // taken, never handled, never acknowledged
			}
			m.work.Add(1)
			go func() {
				defer m.work.Done()
				time.Sleep(handlingTime) // the time is the scenario: the handler's work a release waits for
				if m.isFrozen() {
					return // died while handling it
				}
				p, _ := strconv.Atoi(msg.Metadata.Get("p"))
				seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
				e.mu.Lock()
				e.log[p] = append(e.log[p], delivery{member: m.name, seq: seq, id: msg.UUID, at: time.Now()})
				e.mu.Unlock()
				msg.Ack()
			}()
		case <-m.ran:
			return
		}
	}
}

func (m *member) isFrozen() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.frozen
}

// kill stops the member as a process that died: its handler takes nothing
// more, and its driver neither renews, releases nor leaves.
func (m *member) kill() {
	m.mu.Lock()
	m.frozen = true
	m.mu.Unlock()
	m.d.halt()
	<-m.ran
}

// close closes the member's driver and waits for it.
func (m *member) close() {
	m.cancel()
	<-m.ran
}

// One driver owns every partition and delivers every entry of each in
// stream order, once.
func TestDriverOwnsAllAndDeliversInOrder(t *testing.T) {
	testserver.Parallel(t)
	e := newDriverEnv(t, 4)
	e.add(t, 8) // before the group exists: Start "0" delivers them
	a := e.start(t, "a")
	e.waitOwners(t, map[string]int{"a": 4})
	e.add(t, 8)
	e.waitDelivered(t)
	e.assertOnceInOrder(t)
	assert.Equal(t, []int{0, 1, 2, 3}, a.d.Owned())
	a.close()
	s := a.d.Stats()
	assert.Equal(t, int64(4), s.Acquired)
	assert.Equal(t, int64(4), s.Released)
	assert.Zero(t, s.Lost)
	assert.Empty(t, e.owners(t), "Close released every partition")
	members, err := NewMembers(e.client, e.layout.MembersKey("g")).List(context.Background())
	require.NoError(t, err)
	assert.Empty(t, members, "Close left the membership")
}

// A second driver that joins gets half the partitions within a few beats,
// and every entry is still delivered once, in per-partition order, by the
// two.
func TestDriverSplitsEvenlyWhenAMemberJoins(t *testing.T) {
	testserver.Parallel(t)
	e := newDriverEnv(t, 8)
	stop := e.publish(t, 100*time.Millisecond)
	a := e.start(t, "a")
	e.waitOwners(t, map[string]int{"a": 8})
	e.waitHandling(t, "a", a.d.Owned()) // a's loops are busy when b joins
	b := e.start(t, "b")
	took := e.waitOwners(t, map[string]int{"a": 4, "b": 4})
	t.Logf("join -> even split: %s (beat %s)", took, testBeat)
	e.waitHandling(t, "b", b.d.Owned())
	stop()
	e.waitDelivered(t)
	e.assertOnceInOrder(t)
	assert.Len(t, a.d.Owned(), 4)
	assert.Len(t, b.d.Owned(), 4)
	sa, sb := a.d.Stats(), b.d.Stats()
	assert.Equal(t, int64(4), sa.Released, "a released what b was given")
	assert.Equal(t, int64(4), sb.Acquired)
	assert.Zero(t, sa.Lost+sb.Lost)
	assert.Positive(t, sb.Rebalances)
}

// When one of two drivers closes, the other owns every partition about a
// beat later, and every entry is still delivered once, in order.
func TestDriverTakesOverWhenAMemberCloses(t *testing.T) {
	testserver.Parallel(t)
	e := newDriverEnv(t, 8)
	stop := e.publish(t, 100*time.Millisecond)
	a := e.start(t, "a")
	b := e.start(t, "b")
	e.waitOwners(t, map[string]int{"a": 4, "b": 4})
	movers := b.d.Owned()
	e.waitHandling(t, "b", movers) // b's loops are busy when it closes
	start := time.Now()
	b.close()
	closed := time.Since(start)
	finishing := 0
	for p, ds := range e.delivered() {
		for _, d := range ds {
			if d.member == "b" {
				assert.False(t, d.at.After(start.Add(closed)), "partition %d: b handled entry %d after its Close returned", p, d.seq)
				if d.at.After(start) {
					finishing++
				}
			}
		}
	}
	// Nothing is left for a to wait out: b's Close deleted its owner
	// records and left the membership.
	assert.Zero(t, e.owners(t)["b"], "owner records b's Close left to lapse")
	members, err := NewMembers(e.client, e.layout.MembersKey("g")).List(context.Background())
	require.NoError(t, err)
	assert.NotContains(t, members, "b", "b's Close left the membership to lapse")
	took := e.waitOwners(t, map[string]int{"a": 8})
	t.Logf("Close took %s (%d handlers finishing); closed -> all taken over: %s more (beat %s)", closed, finishing, took, testBeat)
	e.waitHandling(t, "a", movers)
	stop()
	e.waitDelivered(t)
	e.assertOnceInOrder(t)
	sb := b.d.Stats()
	assert.Equal(t, sb.Acquired, sb.Released, "b released every partition it had acquired")
	assert.Zero(t, a.d.Stats().Lost+sb.Lost)
}

// A driver whose process dies (no release, no leave, entries left pending)
// has its partitions taken over once their records lapse: the entries it
// left pending are handed over and delivered first, in order, before new
// ones.
func TestDriverTakesOverFromAMemberThatDied(t *testing.T) {
	testserver.Parallel(t)
	e := newDriverEnv(t, 8)
	stop := e.publish(t, 100*time.Millisecond)
	a := e.start(t, "a")
	b := e.start(t, "b")
	e.waitOwners(t, map[string]int{"a": 4, "b": 4})
	dead := b.d.Owned()
	e.waitHandling(t, "b", dead) // b dies at work, with entries pending
	released := b.d.Stats().Released
	lapsed := e.lapses(t)
	b.kill()
	took := e.waitOwners(t, map[string]int{"a": 8})
	t.Logf("kill -> all taken over: %s (owner TTL %s, beat %s)", took, testTTL, testBeat)
	// a took each over once the server expired b's record, which an
	// overwrite or a delete of the record would not have done.
	for _, p := range dead {
		lapsed(p)
	}
	e.waitHandling(t, "a", dead)
	stop()
	e.waitDelivered(t)
	e.assertOnceInOrder(t)
	sa := a.d.Stats()
	assert.Positive(t, sa.HandedOver, "b left entries pending, which a's hand-overs moved")
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, a.d.Owned())
	assert.Equal(t, released, b.d.Stats().Released, "b died: it released nothing")
}

// A config without a required setting, or with a beat too slow for its
// TTLs, is refused, naming the setting.
func TestDriverConfigValidate(t *testing.T) {
	run := func(context.Context, Owned) {}
	ok := DriverConfig{Group: "g", Member: "m", Start: "$", Run: run, OwnerTTL: 10 * time.Second}
	ok.setDefaults()
	require.NoError(t, ok.Validate())
	cases := []struct {
		name string
		edit func(c *DriverConfig)
		want string
	}{
		{"no group", func(c *DriverConfig) { c.Group = "" }, "Group"},
		{"no member", func(c *DriverConfig) { c.Member = "" }, "Member"},
		{"no start", func(c *DriverConfig) { c.Start = "" }, "Start"},
		{"no run", func(c *DriverConfig) { c.Run = nil }, "Run"},
		{"negative beat", func(c *DriverConfig) { c.Beat = -time.Second }, "positive"},
		{"slow beat", func(c *DriverConfig) { c.Beat = c.OwnerTTL / 2 }, "a third"},
		{"no page", func(c *DriverConfig) { c.HandOverPage = -1 }, "HandOverPage"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			assert.ErrorContains(t, cfg.Validate(), c.want)
		})
	}
	l, err := NewLayout("t", 2)
	require.NoError(t, err)
	_, err = NewDriver(nil, l, DriverConfig{Group: "g", Member: "m", Start: "$"})
	assert.ErrorContains(t, err, "invalid driver config")
}
