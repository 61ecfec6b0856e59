package loop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// fakeServer is a Server that keeps one stream, one group and one consumer
// in memory, and logs every call in order, so that the loop's decisions can
// be checked without a server. It knows only what the loop's rules need: new
// entries go to this consumer in stream order, pending entries carry a
// delivery count, and a test can hand an entry to "another consumer".
type fakeServer struct {
	mu      sync.Mutex
	ids     []string       // the stream, in order
	next    int            // index of the first entry not delivered yet
	pending map[string]int // id -> delivery count, for this consumer
	taken   map[string]bool
	log     []string // "op id,id,..." in the order the calls reached the server
	added   chan struct{}

	// delay, when set, is slept before a call that reads new entries takes
	// them: a round trip, and a way to shuffle concurrent calls.
	delay func() time.Duration
	// readErr, when set, fails the next Send that reads.
	readErr error
	// sendErr, when set, fails the whole next Send.
	sendErr error
	// onHold is told of each Hold call's answer.
	onHold func(ids []string, counts []int64)

	interrupt sync.Once
	stopped   chan struct{}
}

func newFakeServer(n int) *fakeServer {
	f := &fakeServer{pending: map[string]int{}, taken: map[string]bool{}, added: make(chan struct{}, 1), stopped: make(chan struct{})}
	f.add(n)
	return f
}

// add appends n entries to the stream.
func (f *fakeServer) add(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.ids = append(f.ids, strconv.Itoa(len(f.ids)+1)+"-0")
	}
	select {
	case f.added <- struct{}{}:
	default:
	}
}

func (f *fakeServer) record(op string, ids []string) {
	f.log = append(f.log, op+" "+strings.Join(ids, ","))
}

// calls returns the log.
func (f *fakeServer) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

// note records an event of the test's own (a handler's) in the log.
func (f *fakeServer) note(op, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(op, []string{id})
}

func fakeEntry(id string) Entry { return Entry{ID: id, Fields: map[string]any{"payload": id}} }

// takeNew delivers up to n new entries to this consumer. f.mu is held.
func (f *fakeServer) takeNew(n int64) []Entry {
	var es []Entry
	for ; f.next < len(f.ids) && int64(len(es)) < n; f.next++ {
		id := f.ids[f.next]
		f.pending[id] = 1
		es = append(es, fakeEntry(id))
	}
	return es
}

func ids(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

func (f *fakeServer) Send(ctx context.Context, t Trip) TripReply {
	if len(t.Reads) > 0 && f.delay != nil {
		time.Sleep(f.delay()) // the time is the scenario: the fake server's latency
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var r TripReply
	if err := f.sendErr; err != nil {
		f.sendErr = nil
		f.record("send-failed", t.Acks)
		return TripReply{AckErr: err, ReadErr: err, BackErr: err}
	}
	if len(t.Acks) > 0 {
		f.record("ack", t.Acks)
		for _, id := range t.Acks {
			if _, ok := f.pending[id]; ok {
				delete(f.pending, id)
				r.Acked++
			}
		}
	}
	var asked int64
	for _, n := range t.Reads {
		if f.readErr != nil {
			r.ReadErr, f.readErr = f.readErr, nil
			f.record("read-failed", nil)
			break
		}
		// A read sent while this consumer still has entries pending (after
		// the Acks that came with it) is a read sent ahead.
		op := "read"
		if len(f.pending) > 0 {
			op = "read-ahead"
		}
		es := f.takeNew(n)
		f.record(op, ids(es))
		r.Entries = append(r.Entries, es...)
		asked += n
	}
	r.Full = len(t.Reads) > 0 && r.ReadErr == nil && int64(len(r.Entries)) == asked
	if len(t.HandBack) > 0 {
		f.record("handback", t.HandBack)
	}
	for _, e := range t.Later {
		f.record("handback-later", []string{e.ID + "@" + e.Idle.String()})
	}
	return r
}

func (f *fakeServer) Block(ctx context.Context, count int64, block time.Duration) ([]Entry, error) {
	timer := time.NewTimer(block)
	defer timer.Stop()
	for {
		f.mu.Lock()
		es := f.takeNew(count)
		if len(es) > 0 {
			f.record("block", ids(es))
			f.mu.Unlock()
			return es, nil
		}
		f.mu.Unlock()
		select {
		case <-f.added:
		case <-timer.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-f.stopped:
			return nil, errors.New("redis: client is closed")
		}
	}
}

func (f *fakeServer) ReadOwn(ctx context.Context, from string, count int64) ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var es []Entry
	for _, id := range f.ids {
		if _, ok := f.pending[id]; ok && idAfter(id, from) && int64(len(es)) < count {
			f.pending[id]++
			es = append(es, fakeEntry(id))
		}
	}
	f.record("drain", ids(es))
	return es, nil
}

// idAfter reports whether id comes after from ("0": before every id).
func idAfter(id, from string) bool {
	a, _ := strconv.Atoi(strings.TrimSuffix(id, "-0"))
	b, _ := strconv.Atoi(strings.TrimSuffix(from, "-0"))
	return a > b
}

func (f *fakeServer) ListOwn(ctx context.Context, from string, count int64) ([]string, error) {
	return nil, nil
}

func (f *fakeServer) Claim(ctx context.Context, from string, count int64) (Claimed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("claim", nil)
	return Claimed{Next: "0-0"}, nil
}

func (f *fakeServer) Hold(ctx context.Context, ids []string) ([]int64, error) {
	f.mu.Lock()
	counts := make([]int64, len(ids))
	for i, id := range ids {
		if n, ok := f.pending[id]; ok && !f.taken[id] {
			counts[i] = int64(n)
		}
	}
	f.record("hold", ids)
	hook := f.onHold
	f.mu.Unlock()
	if hook != nil {
		hook(ids, counts)
	}
	return counts, nil
}

func (f *fakeServer) ClaimBack(ctx context.Context, id string, count int64) (ClaimedBack, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("claimback", []string{id})
	n, ok := f.pending[id]
	if !ok || f.taken[id] {
		return ClaimedBack{Status: "gone"}, nil
	}
	if int64(n) == count {
		n++
		f.pending[id] = n
	}
	return ClaimedBack{Status: "ok", Count: int64(n), Fields: fakeEntry(id).Fields}, nil
}

func (f *fakeServer) Failed(err error, delay time.Duration) time.Duration { return time.Millisecond }

func (f *fakeServer) Interrupt() { f.interrupt.Do(func() { close(f.stopped) }) }

// failNext fails the whole next Send with err.
func (f *fakeServer) failNext(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendErr = err
}

// take hands ids to another consumer: Hold and ClaimBack find them taken.
func (f *fakeServer) take(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.taken[id] = true
	}
}

// testConfig is a loop's config for the fake: no claim beat, Acks held for
// long unless a test says otherwise.
func testConfig() Config {
	return Config{
		Stream: "s", Group: "g", Consumer: "c",
		BatchSize:        10,
		PrefetchWindow:   -1, // full batches
		ReadAheadBytes:   -1,
		BlockTime:        time.Second,
		ClaimInterval:    -1,
		ClaimMinIdle:     time.Minute,
		AckFlushInterval: time.Minute,
		CloseGrace:       time.Second,
		NackDelay:        func(int64) time.Duration { return 0 },
	}
}

// testDeps are a loop's dependencies on srv, for the tests.
func testDeps(srv Server) Deps {
	return Deps{
		Server:   srv,
		Counters: &Counters{},
		Logger:   watermill.NopLogger{},
		Handling: Handling{
			Decode: func(e Entry) (*message.Message, error) {
				return message.NewMessage(e.ID, []byte(fmt.Sprint(e.Fields["payload"]))), nil
			},
			DeadLetter: func(context.Context, Entry, int64, error) error { return nil },
			GiveUp:     func(context.Context, *message.Message, int64, string) error { return nil },
		},
	}
}

// newTestGroup returns a loop on srv that does not run: a test drives its
// steps.
func newTestGroup(cfg Config, srv Server) *Group {
	return NewGroup(cfg, testDeps(srv), make(chan *message.Message))
}

// run starts the loop of cfg on srv (and shared, if not nil) and returns
// its channel, a cancel that ends it, and a channel closed once Run has
// returned. The test ends it if it did not.
func run(t *testing.T, cfg Config, srv Server, shared Waiter) (<-chan *message.Message, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	deps := testDeps(srv)
	if shared != nil {
		deps.Shared = shared
	}
	return runWith(t, cfg, deps)
}

// runWith is run with deps of the test's own.
func runWith(t *testing.T, cfg Config, deps Deps) (<-chan *message.Message, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l := NewGroup(cfg, deps, out)
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		for range out {
		}
		<-done
	})
	return out, cancel, done
}

// receive takes the next message, failing the test if none comes in time
// (a bound against a hang, never a speed requirement).
func receive(t *testing.T, out <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-out:
		if !ok {
			t.Fatal("the channel closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10 s")
		return nil
	}
}
