package loop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
	"github.com/echomq/valkeystream/internal/coalesce"
	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/serverinfo"
)

// RedisServer is the Server of one group subscription on a go-redis client:
// every call goes through the user's client, but blocking reads, which go
// through a reader of their own (reader.go) where the client is a
// *redis.Client or a *redis.ClusterClient, and through a connection of its
// pool where it is a Sentinel client.
type RedisServer struct {
	client redis.UniversalClient
	connMu sync.Mutex // guards conn, which Block replaces, and interrupted
	// reader is what blocking reads go through unless conn is set: a
	// client of the subscription's own (ownReader), or the user's client.
	reader    BlockingReader
	ownReader bool
	// conn, when set, is the connection of the user's pool that blocking
	// reads go through (see newBlockingReader).
	conn          *poolConn
	interrupted   bool     // Interrupt was called: no read starts any more
	keys          []string // the stream key, as the scripts take it
	opt           RedisServerOptions
	readerHints   failover.Hints
	interruptOnce sync.Once
}

// RedisServerOptions are what a RedisServer reads of its subscription.
type RedisServerOptions struct {
	Key, Group, Consumer string
	// ClaimMinIdle is the claim threshold, BlockTime the longest blocking
	// read.
	ClaimMinIdle, BlockTime time.Duration
	// ClaimInReads makes reads of new entries claim idle entries too, where
	// the server can (XREADGROUP ... CLAIM); false with NoReclaim.
	ClaimInReads bool
	// DeleteAcked acknowledges with XACKDEL ... ACKED where the server can,
	// deleting each entry every group has acknowledged.
	DeleteAcked bool
	// Hints are the Subscriber's failover hints for the client.
	Hints *failover.Hints
	// Verbs tells which newer verbs the server has (nil: none), finding it
	// out when it does not know (see serverinfo.Known); Forget is told a
	// failed call's error, after which Verbs finds out again.
	Verbs  func(context.Context) serverinfo.Verbs
	Forget func()
	// Cached returns the verbs when they are known, without a call: most
	// calls, which then need no bound of their own.
	Cached func() (serverinfo.Verbs, bool)
	// Pipes, unless nil, sends the last round trip of the subscription
	// (Trip.Last) in a pipeline shared with the last round trips of the
	// other subscriptions on the client that end at the same time, so
	// that many ending at once need few connections.
	Pipes *coalesce.Pipes
}

// NewRedisServer returns the Server of the subscription o names, through
// client.
func NewRedisServer(client redis.UniversalClient, o RedisServerOptions) *RedisServer {
	reader, own := newBlockingReader(client, o.BlockTime)
	s := &RedisServer{client: client, ownReader: own, keys: []string{o.Key}, opt: o}
	if c, ok := reader.(*redis.Conn); ok {
		s.conn = newPoolConn(c)
	} else {
		s.reader = reader
	}
	return s
}

// verbs returns the newer verbs the server has; a probe the context ends
// first answers none.
func (s *RedisServer) verbs(ctx context.Context) serverinfo.Verbs {
	if s.opt.Verbs == nil {
		return serverinfo.Verbs{}
	}
	if s.opt.Cached != nil {
		if v, ok := s.opt.Cached(); ok {
			return v
		}
	}
	var v serverinfo.Verbs
	if bounded.Call(ctx, func() { v = s.opt.Verbs(ctx) }) != nil {
		// The probe goes on in the background and writes v: not read.
		return serverinfo.Verbs{}
	}
	return v
}

// claimArg is the CLAIM of a read of new entries: the claim threshold where
// the subscription reclaims and the server claims inside reads, else 0.
func (s *RedisServer) claimArg(v serverinfo.Verbs) time.Duration {
	if s.opt.ClaimInReads && v.ClaimInRead {
		return s.opt.ClaimMinIdle
	}
	return 0
}

// Every call returns when ctx ends, whether or not the client honours
// context deadlines (see internal/bounded): a subscription that ends is
// never held up by a call the network holds up.

// Send sends t's XACK, its reads and its hand-back in one pipeline. This is
// the one place an XACK of the loop is built.
func (s *RedisServer) Send(ctx context.Context, t Trip) TripReply {
	var r TripReply
	if err := bounded.Call(ctx, func() { r = s.send(ctx, t) }); err != nil {
		return TripReply{AckErr: err, ReadErr: err, BackErr: err}
	}
	return r
}

func (s *RedisServer) send(ctx context.Context, t Trip) TripReply {
	v := s.verbs(ctx)
	claim := s.claimArg(v)
	pipe := s.client.Pipeline()
	var ack ackCmd
	if len(t.Acks) > 0 {
		ack = s.ack(ctx, pipe, v, t.Acks)
	}
	reads := make([]*redis.XStreamSliceCmd, len(t.Reads))
	var asked int64
	for i, n := range t.Reads {
		var once redis.Cmder
		reads[i], once = NewReadOnce(ctx, ReadArgs{Group: s.opt.Group, Consumer: s.opt.Consumer, Count: n, Block: -1,
			Claim: claim, Streams: []string{s.keys[0], ">"}})
		_ = pipe.Process(ctx, once)
		asked += n
	}
	var back []*redis.Cmd
	if len(t.HandBack) > 0 {
		back = append(back, pipe.Do(ctx, HandBackArgs(s.keys[0], s.opt.Group, s.opt.Consumer, t.HandBack)...))
	}
	for _, e := range t.Later {
		back = append(back, pipe.Do(ctx, HandBackIdleArgs(s.keys[0], s.opt.Group, s.opt.Consumer, []string{e.ID}, e.Idle)...))
	}
	if t.Last && s.opt.Pipes != nil {
		s.opt.Pipes.Exec(ctx, pipe.Cmds())
	} else {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	var r TripReply
	if ack != nil {
		r.Acked, r.AckErr = ack.acked()
	}
	var got int64
	for _, read := range reads {
		streams, err := read.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			r.ReadErr = err
			break
		}
		for _, st := range streams {
			r.Entries = appendEntries(r.Entries, st.Messages)
		}
	}
	got = int64(len(r.Entries))
	r.Full = len(reads) > 0 && r.ReadErr == nil && got == asked
	for _, b := range back {
		r.BackErr = errors.Join(r.BackErr, b.Err())
	}
	return r
}

// Block reads new entries through the subscription's own reader.
// A reader of its own needs no bound: Interrupt closes it, which ends the
// read at once. A read on a connection of the user's pool that outlives ctx
// goes on, and closes the connection when it returns if Interrupt was
// called meanwhile.
func (s *RedisServer) Block(ctx context.Context, count int64, block time.Duration) ([]Entry, error) {
	if s.ownReader {
		return s.block(ctx, count, block)
	}
	var es []Entry
	var err error
	if berr := bounded.Call(ctx, func() { es, err = s.block(ctx, count, block) }); berr != nil {
		return nil, berr
	}
	return es, err
}

func (s *RedisServer) block(ctx context.Context, count int64, block time.Duration) ([]Entry, error) {
	s.connMu.Lock()
	conn := s.conn
	s.connMu.Unlock()
	a := ReadArgs{Group: s.opt.Group, Consumer: s.opt.Consumer, Count: count,
		Block: block, Claim: s.claimArg(s.verbs(ctx)), Streams: []string{s.keys[0], ">"}}
	var streams []redis.XStream
	var err error
	if conn != nil {
		streams, err = conn.read(ctx, a)
	} else {
		streams, err = BlockingRead(ctx, s.reader, s.ownReader, a)
	}
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		if conn != nil {
			// A connection of the user's pool stays failed once it has
			// failed: the next read takes a new one, unless the
			// subscription has ended.
			conn.Close()
			s.connMu.Lock()
			if s.conn == conn && !s.interrupted && ctx.Err() == nil {
				s.conn = newPoolConn(s.client.(*redis.Client).EphemeralConn())
			}
			s.connMu.Unlock()
		}
		return nil, err
	}
	var es []Entry
	for _, st := range streams {
		es = appendEntries(es, st.Messages)
	}
	return es, nil
}

// ReadOwn reads own pending entries with XREADGROUP ... <from>.
func (s *RedisServer) ReadOwn(ctx context.Context, from string, count int64) ([]Entry, error) {
	var streams []redis.XStream
	var err error
	if berr := bounded.Call(ctx, func() {
		streams, err = s.client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: s.opt.Group, Consumer: s.opt.Consumer, Streams: []string{s.keys[0], from}, Count: count, Block: -1,
		}).Result()
	}); berr != nil {
		return nil, berr
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var es []Entry
	for _, st := range streams {
		es = appendEntries(es, st.Messages)
	}
	return es, nil
}

// ListOwn lists own pending entries with XPENDING.
func (s *RedisServer) ListOwn(ctx context.Context, from string, count int64) ([]string, error) {
	return ListPending(ctx, s.client, s.keys[0], s.opt.Group, s.opt.Consumer, from, count)
}

// ListPending lists the ids of up to count pending entries of consumer in
// group of stream, from the XPENDING range start from, with XPENDING; the
// call ends with ctx whatever the client's options.
func ListPending(ctx context.Context, client redis.UniversalClient, stream, group, consumer, from string, count int64) ([]string, error) {
	var pending []redis.XPendingExt
	var err error
	if berr := bounded.Call(ctx, func() {
		pending, err = client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: group, Consumer: consumer, Start: from, End: "+", Count: count,
		}).Result()
	}); berr != nil {
		return nil, berr
	}
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(pending))
	for i, p := range pending {
		ids[i] = p.ID
	}
	return ids, nil
}

// Claim runs XAUTOCLAIM.
func (s *RedisServer) Claim(ctx context.Context, from string, count int64) (Claimed, error) {
	var reply []any
	var err error
	if berr := bounded.Call(ctx, func() {
		reply, err = s.client.Do(ctx, "XAUTOCLAIM", s.keys[0], s.opt.Group, s.opt.Consumer,
			s.opt.ClaimMinIdle.Milliseconds(), from, "COUNT", count).Slice()
	}); berr != nil {
		return Claimed{}, berr
	}
	if err != nil {
		return Claimed{}, err
	}
	return parseAutoClaim(reply)
}

// Hold runs holdScript.
func (s *RedisServer) Hold(ctx context.Context, ids []string) ([]int64, error) {
	args := make([]any, 0, len(ids)+2)
	args = append(args, s.opt.Group, s.opt.Consumer)
	for _, id := range ids {
		args = append(args, id)
	}
	var counts []int64
	var err error
	if berr := bounded.Call(ctx, func() { counts, err = holdScript.Run(ctx, s.client, s.keys, args...).Int64Slice() }); berr != nil {
		return nil, berr
	}
	if err == nil && len(counts) != len(ids) {
		err = fmt.Errorf("the hold call answered %d counts for %d entries", len(counts), len(ids))
	}
	return counts, err
}

// ClaimBack runs claimBackScript.
func (s *RedisServer) ClaimBack(ctx context.Context, id string, count int64) (ClaimedBack, error) {
	var reply []any
	var err error
	if berr := bounded.Call(ctx, func() {
		reply, err = claimBackScript.Run(ctx, s.client, s.keys, s.opt.Group, s.opt.Consumer, id, count).Slice()
	}); berr != nil {
		return ClaimedBack{}, berr
	}
	if err != nil {
		return ClaimedBack{}, err
	}
	return ParseClaimBack(reply)
}

// Failed tells the failover hints of the user's client and of the reader.
func (s *RedisServer) Failed(err error, delay time.Duration) time.Duration {
	if c, ok := s.reader.(*redis.ClusterClient); ok {
		s.readerHints.Failed(c, err)
	}
	if s.opt.Forget != nil && (failover.Symptom(err) || serverinfo.RefusedVerb(err)) {
		s.opt.Forget() // the next call may reach another node, or an older one answered
	}
	if s.opt.Hints == nil {
		return delay
	}
	return s.opt.Hints.RetryDelay(s.client, err, delay)
}

// Interrupt closes the reader, once; a second call returns once the first
// has closed it.
// A connection of the user's pool (a Sentinel client's) is closed at once
// when no read runs on it, else by that read when it returns (within
// BlockTime, or the client's timeouts on a network that holds it up):
// Interrupt does not wait for the read, and no read starts after it, on
// that connection or on a new one.
func (s *RedisServer) Interrupt() {
	s.interruptOnce.Do(func() {
		s.connMu.Lock()
		defer s.connMu.Unlock()
		s.interrupted = true
		if s.ownReader {
			_ = s.reader.Close()
			return
		}
		if s.conn != nil {
			s.conn.Close()
		}
	})
}

// poolConn is a connection of the user's pool that blocking reads go
// through, with the reads that run on it counted (bounded.Conn), so that a
// read Block stopped waiting for (bounded.Call) is never pulled from under
// it: a Close while a read runs is left to that read, which closes the
// connection when it returns.
type poolConn struct{ conn *bounded.Conn[*redis.Conn] }

func newPoolConn(c *redis.Conn) *poolConn { return &poolConn{conn: bounded.NewConn(c, false)} }

// errConnClosed fails a read that did not start because its connection
// was closed.
var errConnClosed = errors.New("the connection of the blocking reads is closed")

// read runs the blocking read a on the connection, counted, unless the
// connection is closing: then it returns errConnClosed.
func (c *poolConn) read(ctx context.Context, a ReadArgs) (streams []redis.XStream, err error) {
	if !c.conn.Use(func(conn *redis.Conn) { streams, err = BlockingRead(ctx, conn, false, a) }) {
		return nil, errConnClosed
	}
	return streams, err
}

// Close closes the connection: at once when no read runs on it, else when
// the last read returns. It returns at once either way. Reads after it do
// not run.
func (c *poolConn) Close() { c.conn.Close() }

// readOnce is a read of new entries that the client never sends again
// after a connection error (go-redis retries a command MaxRetries times
// unless it says NoRetry). A read sent again takes new entries a second
// time, and the entries the first one took, whose reply was lost, stay
// pending for this consumer, unseen until a claim takes them after
// ClaimMinIdle; a failed read instead makes the loop drain its own pending
// list at once, which delivers them. A pipeline that carries one is not
// sent again either.
type readOnce struct{ *redis.XStreamSliceCmd }

func (readOnce) NoRetry() bool { return true }

// ReadArgs is one XREADGROUP ... > of new entries.
type ReadArgs struct {
	Group, Consumer string
	Count           int64
	// Block is the longest wait for the first entry; negative: no wait.
	Block time.Duration
	// Claim, when positive, makes the read bring entries pending for longer
	// than it first (CLAIM min-idle-time, Redis 8.4), longest idle first,
	// each with its delivery count (see appendEntries).
	Claim   time.Duration
	Streams []string // keys, then one ">" per key
}

// NewReadOnce returns the XREADGROUP of a, for a client never to send
// again (the second value, to Process), and its result (the first). It sets
// no read timeout of its own: the client's ReadTimeout must cover a.Block.
func NewReadOnce(ctx context.Context, a ReadArgs) (*redis.XStreamSliceCmd, redis.Cmder) {
	args := make([]any, 0, 11+len(a.Streams))
	args = append(args, "xreadgroup", "group", a.Group, a.Consumer, "count", a.Count)
	if a.Block >= 0 {
		args = append(args, "block", a.Block.Milliseconds())
	}
	if a.Claim > 0 {
		args = append(args, "claim", a.Claim.Milliseconds())
	}
	args = append(args, "streams")
	for _, s := range a.Streams {
		args = append(args, s)
	}
	cmd := redis.NewXStreamSliceCmd(ctx, args...)
	return cmd, readOnce{cmd}
}

// appendEntries appends msgs to es. A read with CLAIM reports with each
// entry its delivery count before this delivery (0 for a new entry), as
// Redis 8.4 to 8.6 answer (docs/server-verbs.md); an entry it claimed gets
// its count after this delivery, as XPENDING reports it.
func appendEntries(es []Entry, msgs []redis.XMessage) []Entry {
	es = slices.Grow(es, len(msgs))
	for _, m := range msgs {
		e := Entry{ID: m.ID, Fields: m.Values}
		if m.DeliveredCount > 0 {
			e.Count = m.DeliveredCount + 1
		}
		es = append(es, e)
	}
	return es
}

// Entries returns the entries of a read's msgs (see appendEntries).
func Entries(msgs []redis.XMessage) []Entry { return appendEntries(nil, msgs) }

// isNoGroup reports whether err is the server's NOGROUP reply: the group or
// the stream is gone.
func isNoGroup(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(strings.TrimPrefix(reply.Error(), "ERR "), "NOGROUP")
}

// handedBackIdle is the idle time given to entries handed back: longer than
// any ClaimMinIdle, so that the next claim beat of a peer takes them.
const handedBackIdle = 30 * 24 * time.Hour

// HandBackArgs is the call that hands entries ids back: XCLAIM on this
// consumer's own name with JUSTID, which leaves the delivery count alone, and
// an idle time no peer waits longer than.
func HandBackArgs(key, group, consumer string, ids []string) []any {
	return HandBackIdleArgs(key, group, consumer, ids, handedBackIdle)
}

// HandBackIdleArgs is HandBackArgs with the idle time idle: a peer whose
// claim threshold is ClaimMinIdle takes the entries ClaimMinIdle - idle
// from now. (XCLAIM ... TIME in the future is clamped to now by the server,
// so IDLE is the way to say when.)
func HandBackIdleArgs(key, group, consumer string, ids []string, idle time.Duration) []any {
	args := make([]any, 0, len(ids)+8)
	args = append(args, "XCLAIM", key, group, consumer, 0)
	for _, id := range ids {
		args = append(args, id)
	}
	return append(args, "IDLE", idle.Milliseconds(), "JUSTID")
}

// CheckScripts queues on pipe a run of each server-side script of the loop
// with arguments that change nothing, so that a client that may not run
// scripts fails when it subscribes rather than at its first Nack, and so
// that the server has them cached (EVAL with the body). A nil reply (or
// redis.Nil) of each is success.
func CheckScripts(ctx context.Context, pipe redis.Pipeliner, key, group, consumer string) []*redis.Cmd {
	keys := []string{key}
	return []*redis.Cmd{
		holdScript.Eval(ctx, pipe, keys, group, consumer),
		claimBackScript.Eval(ctx, pipe, keys, group, consumer, "0-1", 0),
	}
}

// The server-side scripts of the loop: the steps that must check who holds
// an entry and act on it in one atomic step. Each touches one stream key, so
// they run on a cluster as well. A failed XPENDING (NOGROUP when the group
// or the stream is gone) is returned as the server's own error reply, so
// that the client sees the same reply prefix on every server version.

// holdScript keeps this consumer's hold on entries it holds (fetched but
// not yet handled, or in a handler's hands). For each id it returns:
//   - the delivery count, after resetting the entry's idle time with
//     XCLAIM ... JUSTID (which leaves the count alone), when the entry is
//     pending for ARGV[2] and still in the stream;
//   - -1 when it is pending for ARGV[2] but its body is gone from the stream
//     (it is left pending, for the caller to acknowledge);
//   - 0 when it is not pending for ARGV[2] any more.
//
// KEYS[1] stream, ARGV[1] group, ARGV[2] consumer, ARGV[3...] ids.
var holdScript = redis.NewScript(`
local out = {}
for i = 3, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if p.err then
    return p
  end
  if #p == 0 then
    out[#out + 1] = 0
  elseif #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i]) == 0 then
    out[#out + 1] = -1
  else
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    out[#out + 1] = p[1][4]
  end
end
return out
`)

// claimBackScript claims a Nacked entry again for the consumer that Nacked
// it, which grows its delivery count, unless another consumer has taken it
// over meanwhile. It returns {"ok", count, fields}, or {"gone"} when the entry
// is not pending (it was acknowledged elsewhere), {"taken"} when another
// consumer holds it, {"missing"} when its body was trimmed or deleted (it is
// left pending, for the caller to acknowledge). Redis 7 and Valkey answer
// XCLAIM of such an entry with nothing; Redis 6.2 with a null element or an
// entry without fields.
//
// It is idempotent, because a client may send it again after a network
// error that hid a reply: it claims only while the entry's count is still
// ARGV[4], that of the Nacked delivery; a higher count means an earlier run
// of the same call claimed it already, and it answers as that run did.
//
// KEYS[1] stream, ARGV[1] group, ARGV[2] consumer, ARGV[3] id, ARGV[4] the
// delivery count of the Nacked delivery.
var claimBackScript = redis.NewScript(`
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p.err then
  return p
end
if #p == 0 then
  return {'gone'}
end
if p[1][2] ~= ARGV[2] then
  return {'taken'}
end
if p[1][4] > tonumber(ARGV[4]) then
  local r = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
  if #r == 0 then
    return {'missing'}
  end
  return {'ok', p[1][4], r[1][2]}
end
local c = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
if #c == 0 or not c[1] or not c[1][2] then
  return {'missing'}
end
local q = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
return {'ok', q[1][4], c[1][2]}
`)

// ackCmd is the acknowledgement of a round trip: XACK, or XACKDEL.
type ackCmd interface {
	// acked returns how many of the ids were pending and are acknowledged
	// now.
	acked() (int64, error)
}

type xack struct{ *redis.IntCmd }

func (a xack) acked() (int64, error) { return a.Result() }

// xackdel is XACKDEL key group ACKED IDS n id...: per id 1 (acknowledged
// and deleted), 2 (acknowledged, kept: a group has not acknowledged it
// yet) or -1 (not pending in this group, as XACK would count 0).
type xackdel struct{ *redis.SliceCmd }

func (a xackdel) acked() (int64, error) {
	replies, err := a.Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, r := range replies {
		if code, ok := r.(int64); ok && code > 0 {
			n++
		}
	}
	return n, nil
}

// ack queues the acknowledgement of ids on pipe: XACKDEL ... ACKED where
// the subscription deletes acknowledged entries and the server has it,
// else XACK. This is the one place an acknowledgement of the loop is built.
func (s *RedisServer) ack(ctx context.Context, pipe redis.Pipeliner, v serverinfo.Verbs, ids []string) ackCmd {
	if s.opt.DeleteAcked && v.AckDel {
		return xackdel{pipe.XAckDel(ctx, s.keys[0], s.opt.Group, "ACKED", ids...)}
	}
	return xack{pipe.XAck(ctx, s.keys[0], s.opt.Group, ids...)}
}
