package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// Delayed messages. A message published with Watermill's delay metadata
// (delay.Message, delay.NewPublisher, middleware.DelayOnError) due in the
// future is not appended to its stream: the Publisher stores it in a sorted
// set beside the stream, scored by its due time in milliseconds by the
// server's clock. Every Subscriber with a running subscription of the topic
// moves the entries that are due into the stream, on a beat of
// DelayedPollInterval (one pipeline per beat for all its topics), with a
// server-side script that appends and removes each entry in one atomic step,
// so a crash never loses or duplicates a delayed message. See docs/delay.md.

// DefaultDelayedPollInterval is how often a Subscriber moves the delayed
// messages of its topics that are due into their streams.
const DefaultDelayedPollInterval = 100 * time.Millisecond

// delayedMoveBatch is the most delayed messages one move appends.
const delayedMoveBatch = 100

// delayedSuffix ends the key of the sorted set of delayed messages of a
// stream key without a hash tag, and delayedTaggedSuffix that of one with a
// hash tag. They differ so that two streams never share a sorted set: the
// sorted set of "{orders}" is not the one of "orders".
const (
	delayedSuffix       = ":delayed"
	delayedTaggedSuffix = ".delayed"
)

// DelayedKey returns the key of the sorted set that holds the delayed
// messages of the stream key streamKey (KeyPrefix plus topic). It lies in the
// same cluster slot as the stream: when streamKey has a hash tag ("{...}"),
// it is streamKey plus ".delayed"; otherwise streamKey is made the tag:
// "{" + streamKey + "}:delayed". A stream key that has no hash tag but
// contains '}' cannot share its slot with another key, so delayed messages
// are refused for it.
func DelayedKey(streamKey string) (string, error) {
	if hasHashTag(streamKey) {
		return streamKey + delayedTaggedSuffix, nil
	}
	if strings.Contains(streamKey, "}") {
		return "", fmt.Errorf("valkeystream: stream key %q contains '}' without a hash tag, so no other key can share its cluster slot: delayed messages need a topic without '}' or with a hash tag such as {orders}", streamKey)
	}
	return "{" + streamKey + "}" + delayedSuffix, nil
}

// hasHashTag reports whether a cluster hashes only part of key: a '{'
// followed, later, by a '}' with at least one byte between them.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	return strings.IndexByte(key[open+1:], '}') > 0
}

// delayOf returns how long msg must wait before it is due, according to its
// delay metadata at now: 0 for a message without delay metadata or one
// already due.
//
// Watermill writes both keys: DelayedForKey holds the exact duration,
// measured when the delay was made (delay.For, delay.Until), and
// DelayedUntilKey the due time truncated to whole seconds. The wait is
// DelayedForKey, counted from now (the publish call, never earlier than
// when the delay was made, so never early), but at most until the end of
// the whole second in DelayedUntilKey. So a message republished with its
// metadata after it was delivered (by a requeuer, or by a handler) waits at
// most the rest of the second it was due in, not its whole delay again. A
// message with only DelayedUntilKey is due at that instant exactly.
func delayOf(msg *message.Message, now time.Time) (time.Duration, error) {
	forText := msg.Metadata.Get(delay.DelayedForKey)
	untilText := msg.Metadata.Get(delay.DelayedUntilKey)
	if forText == "" && untilText == "" {
		return 0, nil
	}
	wait := time.Duration(math.MaxInt64)
	if forText != "" {
		d, err := time.ParseDuration(forText)
		if err != nil {
			return 0, fmt.Errorf("%w: message %s has %s %q, which is not a duration: %w", ErrInvalidMessage, msg.UUID, delay.DelayedForKey, forText, err)
		}
		wait = d
	}
	if untilText != "" {
		until, err := time.Parse(time.RFC3339Nano, untilText)
		if err != nil {
			return 0, fmt.Errorf("%w: message %s has %s %q, which is not an RFC 3339 time: %w", ErrInvalidMessage, msg.UUID, delay.DelayedUntilKey, untilText, err)
		}
		if forText != "" && until.Nanosecond() == 0 {
			until = until.Add(time.Second) // the due time lies within that second
		}
		wait = min(wait, until.Sub(now))
	}
	return max(wait, 0), nil
}

// delayPlan is what the delay metadata of the messages of one Publish call
// asks for.
type delayPlan struct {
	waits   []time.Duration // by message; nil when no message waits
	err     error           // a message's delay metadata cannot be read
	delayed int             // how many messages wait
}

// planDelays reads the delay metadata of msgs at now.
func planDelays(msgs []*message.Message, now time.Time) delayPlan {
	var p delayPlan
	for i, m := range msgs {
		wait, err := delayOf(m, now)
		if err != nil {
			return delayPlan{err: err}
		}
		if wait == 0 {
			continue
		}
		if p.waits == nil {
			p.waits = make([]time.Duration, len(msgs))
		}
		p.waits[i] = wait
		p.delayed++
	}
	return p
}

// any reports whether the call needs the delayed path: a message waits, or a
// delay cannot be read.
func (p delayPlan) any() bool { return p.delayed > 0 || p.err != nil }

// publishDelayed writes msgs, of which at least one waits, in one atomic
// script call: messages due now are appended to the stream (with the
// topic's retention), the others are added to the topic's sorted set of
// delayed messages. Either all are written or none.
func (p *Publisher) publishDelayed(topic string, msgs []*message.Message, plan delayPlan) error {
	fail := func(err error) error {
		return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
	}
	if plan.err != nil {
		return fail(plan.err)
	}
	key := p.config.KeyPrefix + topic
	delayedKey, err := DelayedKey(key)
	if err != nil {
		return fail(err)
	}
	trimBy, trimTo := "", ""
	if r, ok := p.config.Retention[topic]; ok {
		switch {
		case r.MaxLen > 0:
			trimBy, trimTo = "MAXLEN", strconv.FormatInt(r.MaxLen, 10)
		case r.MaxAge > 0:
			if oldest := time.Now().Add(-r.MaxAge).UnixMilli(); oldest > 0 {
				trimBy, trimTo = "MINID", strconv.FormatInt(oldest, 10)
			}
		}
	}
	args := make([]any, 0, 2+2*len(msgs))
	args = append(args, trimBy, trimTo)
	for i, m := range msgs {
		fields, err := p.config.Marshaler.Marshal(topic, m)
		if err != nil {
			return fail(fmt.Errorf("encoding message %s: %w", m.UUID, err))
		}
		member, err := encodeDelayedEntry(fields)
		if err != nil {
			return fail(fmt.Errorf("encoding message %s: %w", m.UUID, err))
		}
		args = append(args, ceilMillis(plan.waits[i]), member)
	}
	ctx, cancel := publishContext(msgs)
	defer cancel()
	if err := p.combiners.wait.runScript(ctx, p.config.Client, key, delayAddScript, []string{delayedKey, key}, args...); err != nil {
		p.failover.failed(p.config.Client, err)
		if errors.Is(err, ErrNotReplicated) {
			return fail(err)
		}
		return fail(fmt.Errorf("storing %d delayed messages in %q (and %d due now in %q): %w",
			plan.delayed, delayedKey, len(msgs)-plan.delayed, key, err))
	}
	return nil
}

// ceilMillis returns d in whole milliseconds, rounded up, so that a message
// is never due before its time.
func ceilMillis(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d > time.Duration(ms)*time.Millisecond {
		ms++
	}
	return ms
}

// encodeDelayedEntry encodes the fields of a stream entry, as a Marshaler
// returns them, into one string that the scripts decode: each field and
// value as its length in decimal, ':', and its bytes. The same message
// always gives the same string, so publishing it twice stores it once.
func encodeDelayedEntry(fields []any) (string, error) {
	var b strings.Builder
	for _, f := range fields {
		var s string
		switch v := f.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		case float64:
			s = strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			s = map[bool]string{false: "0", true: "1"}[v]
		default:
			return "", fmt.Errorf("%w: entry field of type %T: a Marshaler for delayed messages may return strings, byte slices, integers, floats and booleans", ErrInvalidMessage, f)
		}
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String(), nil
}

// decodeEntryLua is the Lua function that reverses encodeDelayedEntry.
const decodeEntryLua = `
local function fields(m)
  local f, p = {}, 1
  while p <= #m do
    local c = string.find(m, ':', p, true)
    local n = tonumber(string.sub(m, p, c - 1))
    f[#f + 1] = string.sub(m, c + 1, c + n)
    p = c + n + 1
  end
  return f
end
`

// delayAddScript writes the messages of one Publish call. For each pair of
// ARGV[3...] (wait in milliseconds, encoded entry): a wait of 0 appends the
// entry to the stream, trimmed as ARGV[1] ("MAXLEN", "MINID" or "") and
// ARGV[2] say; a positive wait adds the entry to the sorted set, scored by
// the server's time in milliseconds (rounded up) plus the wait. An entry
// already waiting keeps its due time. It returns how many messages were
// written.
//
// KEYS[1] sorted set of delayed entries, KEYS[2] stream.
var delayAddScript = redis.NewScript(decodeEntryLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.ceil(tonumber(t[2]) / 1000)
for i = 3, #ARGV, 2 do
  local wait = tonumber(ARGV[i])
  if wait > 0 then
    redis.call('ZADD', KEYS[1], 'NX', now + wait, ARGV[i + 1])
  elseif ARGV[1] ~= '' then
    redis.call('XADD', KEYS[2], ARGV[1], '~', ARGV[2], '*', unpack(fields(ARGV[i + 1])))
  else
    redis.call('XADD', KEYS[2], '*', unpack(fields(ARGV[i + 1])))
  end
end
return (#ARGV - 2) / 2
`)

// delayedMoves moves the due delayed messages of every topic a Subscriber
// subscribes to: one goroutine per Subscriber that, every
// DelayedPollInterval, runs delayMoveScript for every subscribed stream in
// one pipeline (go-redis splits it per node on a cluster client), instead of
// one goroutine and one round trip per subscription. A topic subscribed
// several times is moved once per beat.
type delayedMoves struct {
	mu      sync.Mutex
	topics  map[string]*delayedTopic // by stream key
	started bool
}

// delayedTopic is one subscribed stream of the delayed mover.
type delayedTopic struct {
	keys     []string // sorted set, stream
	subs     int      // subscriptions of the stream
	logger   watermill.LoggerAdapter
	failures int       // consecutive failed moves
	retryAt  time.Time // after a failure: no move before
}

// startDelayedMover adds the stream key of a subscription whose context is
// ctx to the Subscriber's delayed mover until ctx ends, unless moving is off
// or the key cannot have delayed messages. The mover starts with the first
// subscription and runs until Close, which waits for it.
func (s *Subscriber) startDelayedMover(ctx context.Context, key string, logFields watermill.LogFields) {
	every := s.config.DelayedPollInterval
	delayedKey, err := DelayedKey(key)
	if every < 0 || err != nil {
		return
	}
	m := &s.delayed
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.topics == nil {
		m.topics = map[string]*delayedTopic{}
	}
	t := m.topics[key]
	if t == nil {
		t = &delayedTopic{keys: []string{delayedKey, key}, logger: s.logger.With(logFields)}
		m.topics[key] = t
	}
	t.subs++
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if t.subs--; t.subs == 0 {
			delete(m.topics, key)
		}
	})
	if !m.started {
		m.started = true
		s.wg.Add(1) // the subscription holds a count already, so Close cannot be past Wait
		go func() {
			defer s.wg.Done()
			s.moveDelayed(every)
		}()
	}
}

// moveDelayed moves due messages of every subscribed stream every beat
// until Close. A stream whose move failed is logged (once per streak of
// failures) and counted, and its next move waits a backoff; a stream whose
// move filled a batch is moved again at once.
func (s *Subscriber) moveDelayed(every time.Duration) {
	ctx := s.closing
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		for again := s.delayed.due(time.Now()); len(again) > 0; {
			again = s.moveDelayedOnce(ctx, every, again)
			if ctx.Err() != nil {
				return
			}
		}
		timer.Reset(every)
	}
}

// due returns the streams to move at now: all but those backing off.
func (m *delayedMoves) due(now time.Time) []*delayedTopic {
	m.mu.Lock()
	defer m.mu.Unlock()
	var due []*delayedTopic
	for _, t := range m.topics {
		if !now.Before(t.retryAt) {
			due = append(due, t)
		}
	}
	return due
}

// moveDelayedOnce moves the due messages of topics in one pipeline, and
// returns those that filled a batch (more may be due).
func (s *Subscriber) moveDelayedOnce(ctx context.Context, every time.Duration, topics []*delayedTopic) (again []*delayedTopic) {
	results := s.runDelayedMoves(ctx, topics)
	if ctx.Err() != nil {
		return nil
	}
	s.delayed.mu.Lock()
	defer s.delayed.mu.Unlock()
	now := time.Now()
	for i, t := range topics {
		moved, err := results[i].moved, results[i].err
		if err != nil {
			t.failures++
			s.stats.faults.Add(1)
			if t.failures == 1 {
				t.logger.Error("Could not move due delayed messages into the stream; retrying with backoff. "+
					"A NOPERM reply needs the key and the commands of delayed messages for this client (see the permissions in docs/design.md), "+
					"or SubscriberConfig.DelayedPollInterval set negative where no delayed messages are published", err,
					watermill.LogFields{"delayed_key": t.keys[0]})
			}
			t.retryAt = now.Add(max(every, backoff(t.failures)) - every)
			continue
		}
		if t.failures > 0 {
			t.logger.Info("Moving due delayed messages works again", watermill.LogFields{"delayed_key": t.keys[0], "failures": t.failures})
		}
		t.failures, t.retryAt = 0, time.Time{}
		if moved > 0 {
			t.logger.Trace("Moved due delayed messages into the stream", watermill.LogFields{"count": moved})
		}
		if moved == delayedMoveBatch && t.subs > 0 {
			again = append(again, t)
		}
	}
	return again
}

// delayMoveScript appends to each stream up to ARGV[1] delayed entries
// whose due time has come by the server's clock, earliest first, removing
// each from its sorted set in the same atomic step. KEYS holds pairs (sorted
// set, stream). It returns, by pair, how many it moved, or the error reply
// that stopped that pair's move (a string); the other pairs go on.
var delayMoveScript = redis.NewScript(decodeEntryLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS, 2 do
  local due = redis.pcall('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
  if due.err then
    out[#out + 1] = due.err
  else
    local n = 0
    for _, m in ipairs(due) do
      local r = redis.pcall('XADD', KEYS[i + 1], '*', unpack(fields(m)))
      if type(r) == 'table' and r.err then
        n = r.err
        break
      end
      r = redis.pcall('ZREM', KEYS[i], m)
      if type(r) == 'table' and r.err then
        n = r.err
        break
      end
      n = n + 1
    end
    out[#out + 1] = n
  end
end
return out
`)

// delayedMovesPerCall is the most streams one call of delayMoveScript
// moves, so that one call never holds the server long.
const delayedMovesPerCall = 200

// runDelayedMoves moves the due messages of topics and returns, by topic,
// how many it moved or why it failed. On a *redis.Client one script call
// moves up to delayedMovesPerCall topics; on other clients, whose keys may
// lie in different cluster slots, one call moves one topic. Most topics
// have no delayed messages, and the script costs the server several
// microseconds per topic even then: so one pipeline first asks, with one
// EXISTS per call, which calls have a sorted set at all, and a second one
// runs the script for those only (the calls refused for want of the script
// are sent again with its body, EVAL). A failed EXISTS runs the script, which
// reports the failure.
func (s *Subscriber) runDelayedMoves(ctx context.Context, topics []*delayedTopic) []delayedMoveResult {
	client := s.config.Client
	perCall := 1
	if _, single := client.(*redis.Client); single {
		perCall = delayedMovesPerCall
	}
	var calls [][]*delayedTopic
	for from := 0; from < len(topics); from += perCall {
		calls = append(calls, topics[from:min(from+perCall, len(topics))])
	}
	pipe := client.Pipeline()
	exists := make([]*redis.IntCmd, len(calls))
	for i, call := range calls {
		keys := make([]string, len(call))
		for j, t := range call {
			keys[j] = t.keys[0]
		}
		exists[i] = pipe.Exists(ctx, keys...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var todo []int        // the calls to run
	for i, c := range exists {
		if n, err := c.Result(); err != nil || n > 0 {
			todo = append(todo, i)
		}
	}
	out := make([]delayedMoveResult, len(topics))
	// send runs the script for the calls todo and returns those that the
	// server refused for not having it.
	send := func(todo []int, eval bool) (noScript []int) {
		pipe := client.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for i, c := range todo {
			keys := make([]string, 0, 2*len(calls[c]))
			for _, t := range calls[c] {
				keys = append(keys, t.keys...)
			}
			if eval {
				cmds[i] = delayMoveScript.Eval(ctx, pipe, keys, delayedMoveBatch)
			} else {
				cmds[i] = delayMoveScript.EvalSha(ctx, pipe, keys, delayedMoveBatch)
			}
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		for i, c := range todo {
			if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
				noScript = append(noScript, c)
			}
			copy(out[c*perCall:], parseDelayedMoves(cmds[i], len(calls[c])))
		}
		return noScript
	}
	if len(todo) > 0 {
		if again := send(todo, false); len(again) > 0 {
			// EVAL loads it, with no permission beyond the one to run
			// it; only the calls refused go again (on a cluster, nodes
			// that had the script ran theirs).
			send(again, true)
		}
	}
	return out
}

// delayedMoveResult is the move of one topic: how many it moved, or why it
// failed.
type delayedMoveResult struct {
	moved int
	err   error
}

// parseDelayedMoves reads the reply of delayMoveScript for n topics.
func parseDelayedMoves(c *redis.Cmd, n int) []delayedMoveResult {
	out := make([]delayedMoveResult, n)
	reply, err := c.Slice()
	if err == nil && len(reply) != n {
		err = fmt.Errorf("moving delayed messages: %d results for %d topics", len(reply), n)
	}
	for i := range out {
		switch {
		case err != nil:
			out[i].err = err
		default:
			switch v := reply[i].(type) {
			case int64:
				out[i].moved = int(v)
			case string:
				out[i].err = errors.New(v)
			default:
				out[i].err = fmt.Errorf("moving delayed messages: unexpected result %v", v)
			}
		}
	}
	return out
}
