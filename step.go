package valkeystream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/combine"
	delayed "github.com/echomq/valkeystream/internal/delay"
	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/slot"
)

// stepKey is the context key of the step of a handling (see ExactlyOnce).
type stepKey struct{}

// step is what one handling under ExactlyOnce writes in one step with its
// input's acknowledgement: the script's keys (the input stream first) and
// operations, gathered while the handler runs.
type step struct {
	x   *ExactlyOnce
	src *stepSource
	d   *loop.Delivery
	// publishTopic is the router's publish topic of the handler, for the
	// messages it returns.
	publishTopic string

	mu    sync.Mutex // guards all below: a handler may publish from several goroutines
	ended bool       // the handler returned: no more outputs
	w     stepWrites
	wait  combine.ReplicaWait
	// crossSlot is the first key outside the input's slot (cluster);
	// plain keeps the outputs for NonAtomicFallback.
	crossSlot string
	plain     []plainOutput
	marks     stepMarks
}

// stepWrites are the script's keys and operations.
type stepWrites struct {
	keys  []string
	types []byte // of each key after the first: keyStream, keyString, ... (stepstate.go)
	ops   []any
	// outputs counts the messages written, stateWrites the handler's
	// writes to its own keys (Step); delayedTo the streams of delayed
	// outputs, whose Subscribers of this process are woken.
	outputs     int
	stateWrites int
	delayedTo   []string
	// checks is set when the script must check the state before writing
	// (Expect, ExpectField, IncrBy, HIncrBy).
	checks bool
}

// plainOutput is one Publish call of a step's outputs.
type plainOutput struct {
	pub   *Publisher
	topic string
	msgs  []*message.Message
}

// stepMarks are the Deduplicator marks a step writes: of a Deduplicator
// around ExactlyOnce (inner, registered on the step) and of one inside it
// (fromOuter, found in the input's context).
type stepMarks struct {
	inner     []*pendingMark
	fromOuter *pendingMark
}

// stepOf returns the step the messages' contexts carry, or nil; an error
// when some carry one and others another or none.
func stepOf(msgs []*message.Message) (*step, error) {
	var st *step
	for i, m := range msgs {
		s, _ := m.Context().Value(stepKey{}).(*step)
		if i > 0 && s != st {
			return nil, fmt.Errorf("%w: one Publish call mixes messages of an exactly-once handling's context with others: publish them in separate calls", ErrNotAtomic)
		}
		st = s
	}
	return st, nil
}

// publish adds msgs, published by p to topic while the handler runs, to
// the step.
func (st *step) publish(p *Publisher, topic string, msgs []*message.Message) error {
	return st.add(p, topic, msgs, false)
}

// add adds msgs, published by p to topic, to the step: by the handler
// (returned false) or returned by it.
func (st *step) add(p *Publisher, topic string, msgs []*message.Message, returned bool) error {
	other := p.config.Client != st.src.client
	if other && !st.x.config.NonAtomicFallback {
		return fmt.Errorf("%w: a message published with an exactly-once handling's context goes through a Publisher of another client than the Subscriber's: use one redis.UniversalClient for both, or set ExactlyOnceConfig.NonAtomicFallback",
			ErrNotAtomic)
	}
	p.mu.RLock()
	closed := p.closed
	p.mu.RUnlock()
	if closed {
		return ErrPublisherClosed
	}
	fail := func(err error) error {
		return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
	}
	// What needs the server (trimming's verbs, a partitioned topic's
	// declaration) is asked before the step is locked.
	ctx, cancel := publishContext(msgs)
	defer cancel()
	trim, _, err := p.trimmingOf(ctx, topic)
	if err != nil {
		return fail(err)
	}
	keys := make([]string, len(msgs))
	for i, m := range msgs {
		if keys[i], err = p.streamKeyOf(ctx, topic, m); err != nil {
			return fail(err)
		}
	}
	now := time.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended && !returned {
		return fmt.Errorf("%w: a message was published with the context of an exactly-once handling after its handler returned: publish before returning", ErrNotAtomic)
	}
	if other {
		// Kept, and published the usual way once the handler succeeded
		// (NonAtomicFallback): never written for a handling that fails.
		st.plain = append(st.plain, plainOutput{pub: p, topic: topic, msgs: msgs})
		if st.crossSlot == "" {
			st.crossSlot = "a Publisher of another client"
		}
		return nil
	}
	saved := st.w
	savedTypes := append([]byte(nil), st.w.types...) // key may change a type in place
	restore := func(err error) error {
		st.w.ops, st.w.keys, st.w.types, st.w.delayedTo = saved.ops, saved.keys, savedTypes, saved.delayedTo
		return err
	}
	for i, m := range msgs {
		fields, err := p.config.Marshaler.Marshal(topic, m)
		if err != nil {
			return restore(fail(fmt.Errorf("encoding message %s: %w", m.UUID, err)))
		}
		wait, err := delayOf(m, now)
		if err != nil {
			return restore(fail(err))
		}
		if err := st.addOutput(keys[i], trim, fields, wait); err != nil {
			return restore(err)
		}
	}
	st.w.outputs += len(msgs)
	st.plain = append(st.plain, plainOutput{pub: p, topic: topic, msgs: msgs})
	if p.config.WaitReplicas > st.wait.Replicas {
		st.wait = combine.ReplicaWait{Replicas: p.config.WaitReplicas, Timeout: p.config.WaitTimeout}
	}
	return nil
}

// maxStepWords is the most arguments one operation of a step may have: the
// script unpacks them, and Lua's unpack fails beyond about 8000, which
// must be refused before the step begins to write.
const maxStepWords = 7000

// addOutput adds one message's write: an XADD to key, or, when it waits,
// its member in key's sorted set of delayed messages. The caller holds mu.
func (st *step) addOutput(key string, trim trimming, fields []any, wait time.Duration) error {
	if wait > 0 {
		dk, err := DelayedKey(key)
		if err != nil {
			return err
		}
		member, err := encodeDelayedEntry(fields)
		if err != nil {
			return err
		}
		i, err := st.key(dk, keyZSet)
		if err != nil {
			return err
		}
		st.w.ops = append(st.w.ops, "DELAY", i, 2, ceilMillis(wait), member)
		st.w.delayedTo = append(st.w.delayedTo, key)
		return nil
	}
	i, err := st.key(key, keyStream)
	if err != nil {
		return err
	}
	if len(fields) > maxStepWords-8 {
		return fmt.Errorf("%w: a message of %d fields and values is too large for an exactly-once step (at most %d)", ErrNotAtomic, len(fields), maxStepWords-8)
	}
	tw := trim.words()
	st.w.ops = append(st.w.ops, "XADD", i, len(tw)+1+len(fields))
	st.w.ops = append(st.w.ops, tw...)
	st.w.ops = append(st.w.ops, "*")
	st.w.ops = append(st.w.ops, fields...)
	return nil
}

// addReturned adds the messages a router handler returned, for the
// router's publish topic, as the ExactlyOnce Publisher publishes them.
func (st *step) addReturned(msgs []*message.Message) error {
	if st.publishTopic == "" {
		return fmt.Errorf("%w: the handler returned %d messages, but the router gave it no publish topic", ErrNotAtomic, len(msgs))
	}
	return st.add(st.x.config.Publisher, st.publishTopic, msgs, true)
}

// addMark adds the done mark of a Deduplicator to the step.
func (st *step) addMark(m *pendingMark) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	i, err := st.key(m.key, keyString)
	if err != nil {
		return err
	}
	st.w.ops = append(st.w.ops, "SET", i, 3, dedupDone, "PX", m.window.Milliseconds())
	if m != st.marks.fromOuter {
		st.marks.inner = append(st.marks.inner, m)
	}
	return nil
}

// key returns the index in KEYS of key, adding it with its type. A key
// the step already has must keep its type: a key of any type (DEL,
// PEXPIRE) takes the first specific one, a stream the step writes
// messages to takes no state write, and the input stream none at all. On
// a cluster, a key outside the input's slot is refused (or, with
// NonAtomicFallback, remembered).
func (st *step) key(key string, typ byte) (int, error) {
	for i, k := range st.w.keys {
		if k != key {
			continue
		}
		if i == 0 {
			if typ != keyStream {
				return 0, fmt.Errorf("%w: it is the input stream, which the step acknowledges", ErrInvalidWrite)
			}
			return 1, nil
		}
		have := st.w.types[i-1]
		switch {
		case have == typ:
		case have == keyStream:
			return 0, fmt.Errorf("%w: the step writes messages to it (a stream), which takes no state write", ErrInvalidWrite)
		case typ == keyStream:
			return 0, fmt.Errorf("%w: the step writes it as a %s already, so no message can be written to it", ErrInvalidWrite, keyTypeNames[have])
		case typ == keyAny:
		case have == keyAny:
			st.w.types[i-1] = typ
		default:
			return 0, fmt.Errorf("%w: the step writes it as a %s already, not a %s", ErrInvalidWrite, keyTypeNames[have], keyTypeNames[typ])
		}
		return i + 1, nil
	}
	if err := st.checkSlot(key); err != nil {
		return 0, err
	}
	st.w.keys = append(st.w.keys, key)
	st.w.types = append(st.w.types, typ)
	return len(st.w.keys), nil
}

// checkSlot returns an error wrapping ErrNotAtomic when the client cannot
// write key in one step with the input stream: on a cluster, another hash
// slot; on a ring, another hash tag.
func (st *step) checkSlot(key string) error {
	if st.inInputSlot(key) {
		return nil
	}
	if st.x.config.NonAtomicFallback {
		if st.crossSlot == "" {
			st.crossSlot = key
		}
		return nil
	}
	return fmt.Errorf("%w: key %q is not in the cluster hash slot of stream %q, so it cannot be written in one step with the input's Ack: give the topics one hash tag, such as {orders}.in and {orders}.out (docs/reliability.md), or set ExactlyOnceConfig.NonAtomicFallback",
		ErrNotAtomic, key, st.d.Stream)
}

// inInputSlot reports whether the step's client can write key in one
// script with the input stream: on a cluster, the same hash slot; on a
// ring, the same hash tag; on one server, always.
func (st *step) inInputSlot(key string) bool {
	switch st.src.client.(type) {
	case *redis.ClusterClient:
		return slot.Of(key) == slot.Of(st.d.Stream)
	case *redis.Ring:
		return slot.Tag(key) == slot.Tag(st.d.Stream)
	}
	return true
}

// end closes the step to more outputs: the handler returned.
func (st *step) end() {
	st.mu.Lock()
	st.ended = true
	st.mu.Unlock()
}

// whyAcknowledged is the stepOutcome.why of an input found acknowledged.
const whyAcknowledged = "acknowledged"

// stepOutcome is what the step's script found.
type stepOutcome struct {
	committed bool
	why       string // when not committed: "acknowledged" or "delivered again to <consumer>, count <n>"
	// changed, when not nil, is the expectation the state did not meet:
	// nothing was written, and the input is still this delivery's.
	changed *StateChangedError
}

// send runs the step's script once.
func (st *step) send(ctx context.Context) (stepOutcome, error) {
	ack := "XACK"
	if st.src.deleteAcked {
		ack = "XACKDEL"
	}
	checks := "0"
	if st.w.checks {
		checks = "1"
	}
	args := make([]any, 0, 7+len(st.w.ops))
	args = append(args, st.d.Group, st.d.Consumer, st.d.ID, st.d.Count, ack, string(st.w.types), checks)
	args = append(args, st.w.ops...)
	run, err := st.wait.Run(ctx, st.src.client, st.d.Stream, stepScript, st.w.keys, args...)
	if err != nil && run == nil {
		return stepOutcome{}, err
	}
	reply, rerr := run.Slice()
	if rerr != nil {
		return stepOutcome{}, rerr
	}
	if err != nil {
		err = notReplicated(err)
	}
	if len(reply) > 0 && reply[0] == "ok" {
		if len(st.w.delayedTo) > 0 {
			for _, k := range st.w.delayedTo {
				delayed.Notify(k)
			}
		}
		return stepOutcome{committed: true}, err
	}
	if len(reply) >= 4 && reply[0] == "changed" {
		return stepOutcome{changed: &StateChangedError{Key: fmt.Sprint(reply[1]), Field: fmt.Sprint(reply[2]), Found: fmt.Sprint(reply[3])}}, nil
	}
	if len(reply) >= 3 {
		return stepOutcome{why: fmt.Sprintf("delivered again to %v, delivery count %v", reply[1], reply[2])}, nil
	}
	return stepOutcome{why: whyAcknowledged}, nil
}

// committed tells the marks of the step that it committed.
func (st *step) committed() { st.finishMarks(markCommitted) }

// abort tells the marks of the step that it wrote nothing.
func (st *step) abort() { st.finishMarks(markDropped) }

// fellBack tells the marks of a Deduplicator around ExactlyOnce that the
// outputs were published the usual way; the one inside writes its own.
func (st *step) fellBack() { st.finishInner(markPlain) }

func (st *step) finishMarks(o markOutcome) {
	st.finishInner(o)
	if st.marks.fromOuter != nil {
		st.marks.fromOuter.finish(o)
	}
}

func (st *step) finishInner(o markOutcome) {
	st.mu.Lock()
	marks := append([]*pendingMark(nil), st.marks.inner...)
	st.mu.Unlock()
	for _, m := range marks {
		m.finish(o)
	}
}

// stepScript is the step: if entry ARGV[3] of stream KEYS[1] is pending
// for consumer ARGV[2] of group ARGV[1] with delivery count ARGV[4], it
// checks the types of the other keys (ARGV[6], a letter per key: '*' any),
// then, when ARGV[7] is '1', the expectations of the handler and whether
// the server would refuse an increment (following the step's own earlier
// writes of those keys), runs the operations from ARGV[8] on (each: name,
// key index, argument count, arguments), acknowledges the entry with
// ARGV[5] (XACK or XACKDEL) and returns {"ok"}. Otherwise it writes
// nothing and returns {"gone"}, {"taken", consumer, count}, {"changed",
// key, field, value found} or an error naming the command and the key. The
// checks come first, so that no write precedes a refusal: a script's
// writes are not undone by a later error.
var stepScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 then
  return {'gone'}
end
if p[1][2] ~= ARGV[2] or tonumber(p[1][4]) ~= tonumber(ARGV[4]) then
  return {'taken', p[1][2], p[1][4]}
end
local function opOn(ki)
  local j = 8
  while j <= #ARGV do
    if tonumber(ARGV[j + 1]) == ki then
      return ARGV[j]
    end
    j = j + 3 + tonumber(ARGV[j + 2])
  end
  return 'write'
end
local function refuse(op, k, why)
  return redis.error_reply('ERR ' .. op .. ' of key ' .. k .. ' refused: ' .. why .. ': nothing of the step was written')
end
local want = {s = 'stream', z = 'zset', k = 'string', h = 'hash', t = 'set'}
for i = 2, #KEYS do
  local w = want[string.sub(ARGV[6], i - 1, i - 1)]
  if w then
    local t = redis.call('TYPE', KEYS[i])['ok']
    if t ~= 'none' and t ~= w then
      return redis.error_reply('WRONGTYPE ' .. opOn(i) .. ' of key ' .. KEYS[i] .. ' refused: the key holds a ' .. t .. ', not a ' .. w .. ': nothing of the step was written')
    end
  end
end
local i
if ARGV[7] == '1' then
  local sv, hv = {}, {}
  -- A 64-bit integer as two exact doubles of one sign, hi * 1e9 + lo, so
  -- that the range and the sums are checked exactly, as the server does.
  local function int64(v)
    if v == '0' then
      return 0, 0
    end
    local neg, d = string.sub(v, 1, 1) == '-', v
    if neg then
      d = string.sub(v, 2)
    end
    if #d > 19 or not string.match(d, '^[1-9]%d*$') or
        (#d == 19 and d > (neg and '9223372036854775808' or '9223372036854775807')) then
      return nil
    end
    local hi, lo = tonumber(string.sub(d, 1, -10)) or 0, tonumber(string.sub(d, -9))
    if neg then
      return -hi, -lo
    end
    return hi, lo
  end
  local function hash(k)
    local h = hv[k]
    if h == nil then
      h = {}
      hv[k] = h
    end
    return h
  end
  local function incr(op, k, v, by)
    if not v then
      v = '0'
    end
    local h1, l1 = int64(v)
    if not h1 then
      return nil, refuse(op, k, 'it holds ' .. string.format('%q', string.sub(v, 1, 40)) .. ', not an integer of 64 bits')
    end
    local h2, l2 = int64(by)
    local hi, lo = h1 + h2, l1 + l2
    if lo >= 1e9 then
      hi, lo = hi + 1, lo - 1e9
    elseif lo <= -1e9 then
      hi, lo = hi - 1, lo + 1e9
    end
    if hi > 0 and lo < 0 then
      hi, lo = hi - 1, lo + 1e9
    elseif hi < 0 and lo > 0 then
      hi, lo = hi + 1, lo - 1e9
    end
    if hi > 9223372036 or (hi == 9223372036 and lo > 854775807) or
        hi < -9223372036 or (hi == -9223372036 and lo < -854775808) then
      return nil, refuse(op, k, 'the result would overflow 64 bits')
    end
    if hi == 0 then
      return string.format('%d', lo)
    end
    return string.format('%s%d%09d', hi < 0 and '-' or '', math.abs(hi), math.abs(lo))
  end
  i = 8
  while i <= #ARGV do
    local op, k, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
    if op == 'EXPECT' then
      local v = redis.call('GET', k) or ''
      if v ~= ARGV[i + 3] then
        return {'changed', k, '', v}
      end
    elseif op == 'EXPECTF' then
      local v = redis.call('HGET', k, ARGV[i + 3]) or ''
      if v ~= ARGV[i + 4] then
        return {'changed', k, ARGV[i + 3], v}
      end
    elseif op == 'SET' then
      sv[k] = ARGV[i + 3]
    elseif op == 'DEL' then
      sv[k] = false
      hv[k] = {[0] = true}
    elseif op == 'INCRBY' then
      local v = sv[k]
      if v == nil then
        v = redis.call('GET', k)
      end
      local r, err = incr(op, k, v, ARGV[i + 3])
      if err then
        return err
      end
      sv[k] = r
    elseif op == 'HSET' then
      hash(k)[ARGV[i + 3]] = ARGV[i + 4]
    elseif op == 'HDEL' then
      local h = hash(k)
      for j = 1, n do
        h[ARGV[i + 2 + j]] = false
      end
    elseif op == 'HINCRBY' then
      local h, f = hash(k), ARGV[i + 3]
      local v = h[f]
      if v == nil then
        if h[0] then
          v = false
        else
          v = redis.call('HGET', k, f)
        end
      end
      local r, err = incr(op, k, v, ARGV[i + 4])
      if err then
        return err
      end
      h[f] = r
    end
    i = i + 3 + n
  end
end
local now
i = 8
while i <= #ARGV do
  local op, k, n = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  if op == 'DELAY' then
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.ceil(tonumber(t[2]) / 1000)
    end
    redis.call('ZADD', k, 'NX', now + tonumber(ARGV[i + 3]), ARGV[i + 4])
  elseif op ~= 'EXPECT' and op ~= 'EXPECTF' then
    local a = {}
    for j = 1, n do
      a[j] = ARGV[i + 2 + j]
    end
    redis.call(op, k, unpack(a))
  end
  i = i + 3 + n
end
if ARGV[5] == 'XACKDEL' then
  redis.call('XACKDEL', KEYS[1], ARGV[1], 'ACKED', 'IDS', 1, ARGV[3])
else
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
end
return {'ok'}
`)

// markOutcome is what became of a Deduplicator's done mark given to a step.
type markOutcome int32

const (
	markOpen      markOutcome = iota // not given to a committed or aborted step: the Deduplicator writes it
	markCommitted                    // written by the step
	markDropped                      // the step wrote nothing: the Deduplicator releases its in-progress mark
	markPlain                        // the outputs were published the usual way (NonAtomicFallback): the Deduplicator writes its mark
)

// pendingMark is the done mark of one handling of a Deduplicator, for a
// step to write.
type pendingMark struct {
	key    string
	window time.Duration
	state  atomic.Int32
	// settle, unless nil, is called once with the outcome (a Deduplicator
	// inside ExactlyOnce, whose middleware has returned by then).
	settle func(markOutcome)
}

func (m *pendingMark) finish(o markOutcome) {
	if m.state.CompareAndSwap(int32(markOpen), int32(o)) && m.settle != nil {
		m.settle(o)
	}
}

func (m *pendingMark) outcome() markOutcome { return markOutcome(m.state.Load()) }

// pendingMarkKey is the context key of the pending mark a Deduplicator
// gives the handler it wraps.
type pendingMarkKey struct{}

// markOf returns the pending mark of a Deduplicator around the handling
// whose context is ctx, or nil.
func markOf(ctx context.Context) *pendingMark {
	m, _ := ctx.Value(pendingMarkKey{}).(*pendingMark)
	return m
}
