// Package sharedread shares blocking reads among group subscriptions. A
// group subscription whose queue is empty, and whose read
// that does not block found nothing, waits for new entries. Instead of a
// blocking read of its own, over a connection of its own, it registers its
// stream with the shared reader of its consumer name: one goroutine and one
// connection that send one
//
//	XREADGROUP GROUP g c COUNT n BLOCK <BlockTime> STREAMS k1 .. kn > .. >
//
// over every registered stream, and hand each stream's entries to its
// subscription. So many topics on one Subscriber cost a few connections and
// one blocked read per sharedReadStreams of them, not one each.
//
// COUNT is the smallest prefetch count among the waiting subscriptions, so a
// slow handler never gets more than it would alone.
//
// A registration that the read in flight does not cover (or covers with a
// larger COUNT) interrupts it with CLIENT UNBLOCK <id>, sent through the
// user's client, where <id> is the reader connection's CLIENT ID, learned
// when it connects. UNBLOCK makes the blocked read return as if it timed out,
// so a reply with entries is never lost; one that answers 0 (the read has not
// reached the server yet) is sent again shortly, while the same read is
// still outstanding. At most one interrupt is asked per read.
//
// The UNBLOCK goes in a transaction with a write that changes nothing
// (MULTI, XACK <key> <group> 0-0, CLIENT UNBLOCK <id>, EXEC): while clients
// are paused (CLIENT PAUSE WRITE or ALL, and the pauses of FAILOVER, of a
// cluster's manual failover and of a SHUTDOWN that waits for replicas), a
// read sent during the pause waits on the server as a postponed command, and
// a CLIENT UNBLOCK of it crashes Redis 7.0 and Valkey 8.0 and older ("Unknown
// btype in replyToBlockedClientTimedOut"; Redis 8.0.6 and the newer ones
// answer 0, which would be re-sent for the whole pause). A read is postponed
// only while a pause holds writes back, and then so is a transaction with a
// write in it: the UNBLOCK runs after the pause, when no read is postponed
// any more.
//
// A subscription that holds nothing waits until its next claim beat (at
// least BlockTime; for ever with NoReclaim), since nothing else needs its
// loop meanwhile, and ends its wait at once when its context ends.
//
// A subscription that a read gave fewer entries than it asked for stays
// covered: the reads that follow go on reading its stream while it handles
// what it got, and park what they bring for its next wait. So a quiet topic
// costs one shared read per message: without it, every message took three
// (the one that brought it, one without its stream, one with it again after
// an interrupt) and an interrupt, and a read of many streams is the dearest
// command here (the server walks every stream of it). A covered subscription
// never reads new entries on its own: two reads of one stream in flight at
// once may reach the server in either order, and the later one would then
// bring the earlier entries. A full read (more may wait) uncovers it, and it
// reads on its own until a read finds nothing, as any busy subscription
// does; only one batch is ever parked (a stream with parked entries is left
// out of the reads until they are taken), so a covered subscription holds
// no more than one read ahead.
//
// Parked entries are this consumer's, and no peer reclaims them before they
// have been idle for ClaimMinIdle: the wait that takes them checks that they
// are still its own only when they have waited that long. If the
// subscription has ended, they are handed back (XCLAIM ... IDLE <large>
// JUSTID), so that a peer takes them at its next claim beat.
//
// Only a *redis.Client (a failover client included) shares reads: in a
// cluster the keys of one XREADGROUP must share a slot, so a cluster
// subscription keeps its blocking reader of its own (internal/loop). Without
// the permission to run CLIENT ID and CLIENT UNBLOCK, the Subscriber falls
// back to blocking readers of their own, and logs it once.
package sharedread

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/loop"
)

// maxStreams is the most streams one shared reader reads: the server walks
// every key of a blocked read when it is sent, when an entry wakes it and
// when it returns (about 2.7 us per key in all on Redis 7.0), and a read is
// sent about once per message delivered, so the work of one message grows
// with this; more subscriptions take more readers (and connections).
const maxStreams = 64

// unblockRetryMax bounds the pause between two tries of an interrupt whose
// read has not reached the server yet.
const unblockRetryMax = 5 * time.Millisecond

// Registry holds a Subscriber's shared readers, by consumer name.
type Registry struct {
	client *redis.Client // the user's; nil: the client cannot share reads
	group  string
	block  time.Duration
	logger watermill.LoggerAdapter
	faults *atomic.Int64
	spawn  func(func()) // runs a goroutine the Subscriber's Close waits for
	// claim is the CLAIM of each read (see loop.ReadArgs.Claim), 0 for none.
	claim func() time.Duration

	mu     sync.Mutex
	off    bool // the client lacks a permission: subscriptions read on their own
	byName map[string][]*reader
}

// NewRegistry returns the shared readers of a Subscriber whose client is
// client, reading for group with BlockTime block. Only a *redis.Client (a
// failover client included) shares reads; with any other client Join
// returns nil. spawn runs each reader's goroutines.
func NewRegistry(client redis.UniversalClient, group string, block time.Duration, logger watermill.LoggerAdapter, faults *atomic.Int64, spawn func(func())) *Registry {
	c, _ := client.(*redis.Client)
	return &Registry{client: c, group: group, block: block, logger: logger, faults: faults, spawn: spawn,
		claim: func() time.Duration { return 0 }}
}

// ClaimInReads makes every shared read claim entries idle for longer than
// the duration claim returns, where it returns more than 0 (see
// loop.ReadArgs.Claim); it is asked before each read. Call it before the
// first Join.
func (reg *Registry) ClaimInReads(claim func() time.Duration) { reg.claim = claim }

// reader is one shared read loop, for one consumer name, over its own
// connection.
type reader struct {
	reg      *Registry
	conn     *readerConn // see newReader
	consumer string
	logger   watermill.LoggerAdapter

	key string // a stream of its first member, for the write of each interrupt

	mu      sync.Mutex
	connID  int64 // CLIENT ID of the connection, learned when it connects
	members map[string]*Member
	st      readState
	sig     signals

	// Owned by the read loop, reused by every read: a read is sent about
	// once per message delivered. streams holds the keys, then a ">" each.
	keys    []string
	streams []string
}

// readConn is the one connection a reader reads over: a client of its own
// (*redis.Client), or one taken from the user's client (*redis.Conn).
type readConn interface {
	loop.BlockingReader
	ClientID(ctx context.Context) *redis.IntCmd
}

// readState is where a reader's read stands; reader.mu guards it.
type readState struct {
	ending      bool          // no members left: end after the read in flight
	reading     bool          // a read is in flight
	seq         uint64        // of the read in flight, or of the last one
	count       int64         // COUNT of the read in flight
	claim       time.Duration // CLAIM of the read in flight, 0 for none
	sentAt      time.Time     // when the read in flight was sent
	interrupted bool          // an interrupt was asked for the read in flight
	interruptOf uint64        // seq of the read the last interrupt is for
}

// signals are the channels between a reader's goroutines.
type signals struct {
	wake chan struct{} // tells the read loop that something changed
	kick chan struct{} // asks the interrupter to interrupt the read in flight
	done chan struct{} // closed when the read loop ends
	// stop ends the wait for a read in flight: endGrace after the last
	// member left, when the interrupt did not end it (a cut network).
	stop    context.Context
	stopNow context.CancelFunc
}

// endGrace is how long a reader whose last member left waits for its read
// in flight to end (after its interrupt) before it stops waiting for it.
const endGrace = 250 * time.Millisecond

// interruptTimeout bounds one interrupt (CLIENT UNBLOCK) of the read in
// flight.
const interruptTimeout = time.Second

// Member is one subscription of a shared reader: the loop.Waiter of that
// subscription. Its fields are guarded by its reader's mu.
type Member struct {
	r        *reader
	name     string                // the stream key
	inRead   uint64                // seq of the last read of its stream
	count    int64                 // prefetch count of the last wait
	got      chan sharedReadResult // of the wait in progress; nil when not waiting
	covered  bool                  // read while not waiting (see the package doc)
	parked   []loop.Entry          // read while not waiting, for the next wait
	parkedAt time.Time             // when the read that brought the first of parked was sent
	failed   error                 // of a read while not waiting, for the next wait
}

type sharedReadResult struct {
	entries []loop.Entry
	full    bool // the read brought all it asked for: more may wait
	err     error
}

// Join returns the share of a shared reader that the subscription of stream
// key, under consumer name consumer, waits with, or nil when it reads on its
// own: a client other than a *redis.Client, or one that lacks a permission
// the shared reader needs.
func (reg *Registry) Join(ctx context.Context, consumer, key string) *Member {
	if reg.client == nil {
		return nil
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if reg.off {
		return nil
	}
	for _, r := range reg.byName[consumer] {
		if m := r.join(key); m != nil {
			return m
		}
	}
	r, err := reg.newReader(ctx, consumer, key)
	if err != nil {
		if redis.HasErrorPrefix(err, "NOPERM") || errors.Is(err, errRefused) {
			reg.off = true
			reg.logger.Info("The client may not run a command that shared reads need (its error names it): every subscription reads new entries over a connection of its own. "+
				"Allow it for this client to share one connection among many subscriptions (see the permissions in docs/design.md)",
				watermill.LogFields{"error": err.Error()})
		} else {
			reg.logger.Debug("Could not start a shared reader; the subscription reads on its own", watermill.LogFields{"error": err.Error()})
		}
		return nil
	}
	if reg.byName == nil {
		reg.byName = map[string][]*reader{}
	}
	reg.byName[consumer] = append(reg.byName[consumer], r)
	m := r.join(key)
	reg.spawn(r.readLoop)
	reg.spawn(r.interrupter)
	return m
}

// newReader connects a shared reader for the subscription of stream key
// and checks that the client may interrupt it: its connection learns its
// CLIENT ID, and the user's client sends the interrupt for it (answered 0:
// nothing is blocked yet).
func (reg *Registry) newReader(ctx context.Context, consumer, key string) (*reader, error) {
	r := &reader{
		reg:      reg,
		key:      key,
		consumer: consumer,
		logger:   reg.logger.With(watermill.LogFields{"consumer_group": reg.group, "consumer": consumer}),
		members:  map[string]*Member{},
		sig:      signals{wake: make(chan struct{}, 1), kick: make(chan struct{}, 1), done: make(chan struct{})},
	}
	r.sig.stop, r.sig.stopNow = context.WithCancel(context.Background())
	if failover.IsSentinel(reg.client) {
		// A Sentinel client follows a failover by closing its own
		// connections to the old master (on +switch-master): a connection
		// taken from its pool is closed with them, so the read fails at once
		// and the next one goes to the new master. A client of its own, made
		// from a copy of the options, would stay on the old master until it
		// is demoted.
		r.conn = newReaderConn(reg.client.EphemeralConn())
	} else {
		r.conn = newReaderConn(reg.newOwnConn(r))
	}
	if err := r.learnID(ctx); err != nil {
		r.sig.stopNow()
		r.conn.Close()
		return nil, err
	}
	if _, err := r.interrupt(ctx); err != nil {
		r.sig.stopNow()
		r.conn.Close()
		return nil, err
	}
	return r, nil
}

// errRefused marks an interrupt that the server refused for the client's
// permissions (NOPERM): it will not work before they change.
var errRefused = errors.New("refused for the client's permissions")

// interrupt sends the transaction that ends the reader's blocked read (see
// the package doc) and returns what CLIENT UNBLOCK answered: 1 when it
// ended a read, 0 when no read was blocked. A refusal wraps errRefused.
//
// A refused MULTI leaves the commands after it to run outside a
// transaction, and its reply makes go-redis drop the connection; a
// refused queued command or EXEC makes the server discard the transaction
// (EXECABORT, with the NOPERM in its text). Either leaves the client's
// connections as they were.
func (r *reader) interrupt(ctx context.Context) (int64, error) {
	var ack, unblock *redis.IntCmd
	_, err := r.reg.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		// The id 0-0 is never an entry's: this XACK acknowledges nothing
		// (and answers 0 where the stream or the group is gone).
		ack = p.XAck(ctx, r.key, r.reg.group, "0-0")
		unblock = p.ClientUnblock(ctx, r.id())
		return nil
	})
	for _, e := range []error{err, ack.Err(), unblock.Err()} {
		var reply redis.Error
		if errors.As(e, &reply) && strings.Contains(reply.Error(), "NOPERM") {
			return 0, fmt.Errorf("%w: %w", errRefused, e)
		}
	}
	if unblock.Err() != nil {
		return 0, unblock.Err()
	}
	return unblock.Val(), nil // the XACK's own error (WRONGTYPE) does not matter
}

// newOwnConn returns a client of one connection for r, made from the
// user's options, whose connection tells r its CLIENT ID each time it
// connects.
func (reg *Registry) newOwnConn(r *reader) *redis.Client {
	opt := loop.OneConnection(reg.client.Options())
	opt.ReadTimeout = loop.BlockingReadTimeout(opt.ReadTimeout, reg.block)
	userOnConnect := opt.OnConnect
	opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userOnConnect != nil {
			if err := userOnConnect(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		r.setID(id)
		return nil
	}
	return redis.NewClient(opt)
}

// learnID asks the reader's connection its CLIENT ID (which connects it),
// for the interrupts.
func (r *reader) learnID(ctx context.Context) error {
	var id int64
	var err error
	if berr := r.conn.call(ctx, func(c readConn) { id, err = c.ClientID(ctx).Result() }); berr != nil {
		return berr
	}
	if err != nil {
		return err
	}
	r.setID(id)
	return nil
}

func (r *reader) setID(id int64) {
	r.mu.Lock()
	r.connID = id
	r.mu.Unlock()
}

func (r *reader) id() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connID
}

// join adds the subscription of key, unless the reader is full or ending.
func (r *reader) join(key string) *Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.st.ending || len(r.members) >= maxStreams {
		return nil
	}
	m := &Member{r: r, name: key}
	r.members[key] = m
	return m
}

// Leave removes the subscription, which ended, and returns the ids of the
// entries parked for it, to hand back. A read in flight that brings entries
// for it hands them back itself. The last member to leave ends the reader.
func (m *Member) Leave() []string {
	r := m.r
	reg := r.reg
	reg.mu.Lock()
	defer reg.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.members, m.name)
	var ids []string
	for _, e := range m.parked {
		ids = append(ids, e.ID)
	}
	m.parked = nil
	if len(r.members) == 0 {
		r.st.ending = true
		list := reg.byName[r.consumer]
		for i, x := range list {
			if x == r {
				reg.byName[r.consumer] = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(reg.byName[r.consumer]) == 0 {
			delete(reg.byName, r.consumer)
		}
		r.interruptLocked(true)
		signal(r.sig.wake)
		time.AfterFunc(endGrace, r.sig.stopNow)
	}
	return ids
}

// Covers reports whether the reads of its reader cover the subscription's
// stream while it does not wait: it must not read new entries on its own
// then.
func (m *Member) Covers() bool {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	return m.covered
}

// Wait waits up to d (for ever when d is negative), or until ctx ends, for
// new entries of the subscription's stream, at most count of them. Entries
// parked for it are returned at once, with the time they were read.
func (m *Member) Wait(ctx context.Context, count int64, d time.Duration) (loop.Waited, error) {
	r := m.r
	r.mu.Lock()
	if len(m.parked) > 0 {
		w := loop.Waited{Entries: m.parked, Full: !m.covered, Since: m.parkedAt}
		m.parked = nil
		r.mu.Unlock()
		return w, nil
	}
	if err := m.failed; err != nil {
		// A read that covered the stream failed: it may have taken entries
		// whose reply was lost. The loop handles it as a failed read of its
		// own, and drains its pending entries before it reads anything new.
		m.failed, m.covered = nil, false
		r.mu.Unlock()
		return loop.Waited{}, err
	}
	got := make(chan sharedReadResult, 1)
	m.got, m.count = got, count
	if r.st.reading && (m.inRead != r.st.seq || count < r.st.count) {
		r.interruptLocked(false)
	}
	signal(r.sig.wake)
	r.mu.Unlock()

	var timeout <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case res := <-got:
		return loop.Waited{Entries: res.entries, Full: res.full}, res.err
	case <-timeout:
	case <-ctx.Done():
	}
	r.mu.Lock()
	if m.got == got {
		m.got = nil // still waiting: nothing came
		if r.st.reading && m.inRead == r.st.seq {
			// The read in flight may yet bring entries of the stream: it
			// parks them, and the subscription may not read on its own
			// before.
			m.covered = true
		}
	}
	r.mu.Unlock()
	select {
	case res := <-got:
		// It came while the wait ended: the loop queues it (and, when it
		// ends, hands it back).
		return loop.Waited{Entries: res.entries, Full: res.full}, res.err
	default:
		return loop.Waited{}, nil
	}
}

// interruptLocked asks the interrupter to end the read in flight, if any,
// and if no interrupt was asked for it yet (or always, when the reader
// ends). r.mu is held.
func (r *reader) interruptLocked(always bool) {
	if !r.st.reading || (r.st.interrupted && !always) {
		return
	}
	r.st.interrupted, r.st.interruptOf = true, r.st.seq
	signal(r.sig.kick)
}

// signal wakes the goroutine that waits on c, without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// readLoop sends the shared read while subscriptions wait, and hands out
// what it brings, until the last member has left. A read it gave up on
// closes the connection when it returns (see readerConn).
func (r *reader) readLoop() {
	defer close(r.sig.done)
	defer r.sig.stopNow()
	defer func() { r.conn.Close() }() // reconnect may have replaced it
	failures := 0                     // consecutive failed reads
	for {
		r.mu.Lock()
		for !r.st.ending && !r.nextReadLocked() {
			r.mu.Unlock()
			<-r.sig.wake
			r.mu.Lock()
		}
		if r.st.ending {
			r.mu.Unlock()
			return
		}
		r.st.reading, r.st.interrupted, r.st.sentAt = true, false, time.Now()
		r.mu.Unlock()

		// Never cancelled: it ends within BlockTime, or at once by an
		// interrupt, and its reply is always read. A blocking read is never
		// sent again by the client after a connection error (go-redis
		// retries only reads that do not block): its entries may have been
		// taken, and the loops drain them.
		var res []redis.XStream
		var err error
		if berr := r.conn.call(r.sig.stop, func(c readConn) { res, err = r.read(c) }); berr != nil {
			// The reader ends, and neither its interrupt nor its block
			// time ended the read (the network is cut): the entries it may
			// take stay pending for the consumer name, for its next drain
			// or a peer's claim after ClaimMinIdle. The read goes on, and
			// closes the connection when it returns. (Only this loop
			// closes the connection, so the call is never refused for a
			// closed one.)
			r.logger.Error("The shared read did not end as the reader ended; entries it may have taken are drained by this consumer name or reclaimed by peers after ClaimMinIdle", berr, nil)
			return
		}
		if err == redis.Nil {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("%w: %w", loop.ErrSharedRead, err)
		}
		r.handOut(r.keys, res, err)
		if err == nil {
			if failures > 0 {
				r.logger.Info("The shared read resumed", watermill.LogFields{"failed_reads": failures})
				failures = 0
			}
			continue
		}
		failures++ // counted in Faults by the subscriptions it fails
		r.reconnect()
		// The first failure is retried as soon as a subscription waits
		// again (a Sentinel failover closes the connection once); the
		// next ones after a backoff, since a client of one connection
		// answers a dial for a second or so after the server came back
		// with the error of its last one (go-redis).
		var delay time.Duration
		if failures > 1 {
			delay = loop.Backoff(failures - 1)
		}
		fields := watermill.LogFields{"failed_reads": failures, "retry_in": delay.String(), "streams": len(r.keys)}
		if failures == 1 {
			r.logger.Error("The shared read failed; the subscriptions it read for drain their pending entries and wait for its next read", err, fields)
		} else {
			fields["error"] = err.Error()
			r.logger.Info("The shared read failed again", fields)
		}
		if !r.pause(delay) {
			return
		}
	}
}

// pause waits d before the next read, and reports false when the reader
// ends meanwhile.
func (r *reader) pause(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-r.sig.stop.Done():
			return false
		case <-r.sig.wake:
			r.mu.Lock()
			ending := r.st.ending
			r.mu.Unlock()
			if ending {
				return false
			}
		}
	}
}

// read sends the read prepared by nextReadLocked over c, the reader's
// connection (see loop.BlockingRead: a client of its own reads without
// retries, a connection of the user's client as go-redis does).
func (r *reader) read(c readConn) ([]redis.XStream, error) {
	_, own := c.(*redis.Client)
	return loop.BlockingRead(context.Background(), c, own, loop.ReadArgs{Group: r.reg.group, Consumer: r.consumer,
		Count: r.st.count, Block: r.reg.block, Claim: r.st.claim, Streams: r.streams})
}

// reconnect replaces a connection taken from the user's client after a
// failed read: a failed one stays failed. (A client of its own connects
// again by itself.)
func (r *reader) reconnect() {
	if r.conn.own {
		return
	}
	r.conn.Close()
	r.setID(0)
	r.conn = newReaderConn(r.reg.client.EphemeralConn())
	// Its id is learned before the next read; until then an interrupt
	// finds no read of it, and is tried again shortly.
	ctx, cancel := context.WithTimeout(r.sig.stop, r.reg.block+time.Second)
	defer cancel()
	if err := r.learnID(ctx); err != nil {
		r.logger.Debug("Could not learn the shared reader's connection id; its next read is not interrupted", watermill.LogFields{"error": err.Error()})
	}
}

// nextReadLocked prepares the next read, of the streams of the waiting
// members and of the covered ones with nothing parked (and no failure to
// report), asking for the smallest count they asked for, and reports
// whether there is any. r.mu is held.
func (r *reader) nextReadLocked() bool {
	r.keys = r.keys[:0]
	var count int64
	seq := r.st.seq + 1
	waiting := true
	for k, m := range r.members {
		if m.got == nil && (!m.covered || len(m.parked) > 0 || m.failed != nil) {
			continue
		}
		waiting = waiting && m.got != nil
		r.keys = append(r.keys, k)
		m.inRead = seq
		if count == 0 || m.count < count {
			count = m.count
		}
	}
	if len(r.keys) == 0 {
		return false
	}
	r.streams = append(r.streams[:0], r.keys...)
	for range r.keys {
		r.streams = append(r.streams, ">")
	}
	r.st.seq, r.st.count = seq, max(count, 1)
	// Claim inside the read only while every subscription it reads for
	// waits: a subscription that does not wait may be draining its own
	// pending list, which would deliver an entry of its own this read
	// claimed a second time. What a claim brings for one that stopped
	// waiting meanwhile is parked, with the time the read was sent: a
	// subscription that began a drain after it drops what the drain
	// delivered (loop.Group.readShared).
	r.st.claim = 0
	if waiting {
		r.st.claim = r.reg.claim()
	}
	return true
}

// handOut gives each waiting member what the read of keys brought (or its
// error), parks the entries of members that stopped waiting, and hands back
// those of streams whose subscription ended.
func (r *reader) handOut(keys []string, res []redis.XStream, err error) {
	var back map[string][]string
	r.mu.Lock()
	r.st.reading = false
	if err != nil {
		for _, k := range keys {
			switch m := r.members[k]; {
			case m == nil:
			case m.got != nil:
				m.got <- sharedReadResult{err: err}
				m.got = nil
			default:
				m.failed = err // for its next wait; no read covers it before
			}
		}
	}
	for _, s := range res {
		if len(s.Messages) == 0 {
			continue
		}
		m := r.members[s.Stream]
		if m == nil {
			if back == nil {
				back = map[string][]string{}
			}
			for _, e := range s.Messages {
				back[s.Stream] = append(back[s.Stream], e.ID)
			}
			continue
		}
		entries := loop.Entries(s.Messages)
		full := int64(len(entries)) >= r.st.count
		m.covered = !full // a full read: the subscription reads on its own, see the package doc
		if m.got != nil {
			m.got <- sharedReadResult{entries: entries, full: full}
			m.got = nil
			continue
		}
		if len(m.parked) == 0 {
			m.parkedAt = r.st.sentAt
		}
		m.parked = append(m.parked, entries...)
	}
	r.mu.Unlock()
	if len(back) > 0 {
		r.handBack(back)
	}
}

// handBack hands back entries that a read brought for subscriptions that
// had ended, so that a peer takes them at its next claim beat.
func (r *reader) handBack(back map[string][]string) {
	ctx, cancel := context.WithTimeout(context.Background(), loop.ExitTimeout)
	defer cancel()
	pipe := r.reg.client.Pipeline()
	for key, ids := range back {
		pipe.Do(ctx, loop.HandBackArgs(key, r.reg.group, r.consumer, ids)...)
	}
	var execErr error
	err := bounded.Call(ctx, func() { _, execErr = pipe.Exec(ctx) })
	if err == nil {
		err = execErr
	}
	if err != nil {
		r.reg.faults.Add(1)
		r.logger.Error("Handing back entries read for subscriptions that had ended failed; peers reclaim them after ClaimMinIdle, or this consumer name drains them when it subscribes again",
			err, watermill.LogFields{"streams": len(back)})
		return
	}
	r.logger.Debug("Handed back entries read for subscriptions that had ended", watermill.LogFields{"streams": len(back)})
}

// unblock sends the interrupt for the reader's connection, and waits
// interruptTimeout for the answer at most.
func (r *reader) unblock() (int64, error) {
	ctx, cancel := context.WithTimeout(r.sig.stop, interruptTimeout)
	defer cancel()
	var n int64
	var err error
	if berr := bounded.Call(ctx, func() { n, err = r.interrupt(ctx) }); berr != nil {
		return 0, berr
	}
	return n, err
}

// interrupter ends the read in flight when asked (kick): it sends the
// interrupt for the reader's connection through the user's client, again
// shortly while the server answers 0 and the same read is outstanding. It
// stops for good once the server refuses one for the client's permissions.
func (r *reader) interrupter() {
	failing := false // logged once per streak of failed interrupts
	for {
		select {
		case <-r.sig.done:
			return
		case <-r.sig.kick:
		}
		r.mu.Lock()
		seq := r.st.interruptOf
		reading := r.st.reading && r.st.seq == seq
		r.mu.Unlock()
		pause := 50 * time.Microsecond
		for reading {
			n, err := r.unblock()
			if err != nil && r.sig.stop.Err() != nil {
				return // the reader ends: its read is given up anyway
			}
			if errors.Is(err, errRefused) {
				// A MULTI refused now let its UNBLOCK run outside the
				// transaction: send no more of them.
				r.reg.faults.Add(1)
				r.logger.Error("The client may no longer interrupt the shared read: waiting subscriptions read again when it times out (BlockTime). "+
					"Allow MULTI, EXEC, XACK and CLIENT UNBLOCK for this client again (see the permissions in docs/design.md)", err, nil)
				return
			}
			if err != nil {
				r.reg.faults.Add(1)
				if !failing {
					failing = true
					r.logger.Error("Interrupting the shared read failed; waiting subscriptions read again when it times out (BlockTime)", err, nil)
				}
				break
			}
			failing = false
			if n == 1 {
				break
			}
			t := time.NewTimer(pause)
			select {
			case <-r.sig.done:
				t.Stop()
				return
			case <-t.C:
			}
			pause = min(2*pause, unblockRetryMax)
			r.mu.Lock()
			reading = r.st.reading && r.st.seq == seq
			r.mu.Unlock()
		}
	}
}
