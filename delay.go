package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	delayed "github.com/echomq/valkeystream/internal/delay"
	"github.com/echomq/valkeystream/internal/slot"

	"github.com/echomq/valkeystream/internal/loop"
)

// Delayed messages. A message published with Watermill's delay metadata
// (delay.Message, delay.NewPublisher, middleware.DelayOnError) due in the
// future is not appended to its stream: the Publisher stores it in a sorted
// set beside the stream, scored by its due time in milliseconds by the
// server's clock. Every Subscriber with a running subscription of the topic
// moves the entries that are due into the stream, on a beat of
// DelayedPollInterval (one pipeline per beat for all its topics), with a
// server-side script that appends and removes each entry in one atomic step,
// so a crash never loses or duplicates a delayed message. The mover and the
// encoding of a waiting entry live in internal/delay; this file keeps the
// publish side, the name of the sorted set and the Subscriber's hold on its
// mover. See docs/delay.md.

// DefaultDelayedPollInterval is how often a Subscriber moves the delayed
// messages of its topics that are due into their streams.
const DefaultDelayedPollInterval = 100 * time.Millisecond

// DefaultDelayedIdlePollInterval is how often a Subscriber that has not
// found delayed messages of its topics yet looks for some.
const DefaultDelayedIdlePollInterval = time.Second

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
	tagged, err := slotTag(streamKey)
	if err != nil {
		return "", fmt.Errorf("%w: delayed messages need a topic without '}' or with a hash tag such as {orders}", err)
	}
	return tagged + delayedSuffix, nil
}

// slotTag returns a stream key without a hash tag made the hash tag of the
// keys that share its cluster slot: "{" + streamKey + "}". A key that
// contains '}' cannot be made one.
func slotTag(streamKey string) (string, error) {
	if strings.Contains(streamKey, "}") {
		return "", fmt.Errorf("valkeystream: stream key %q contains '}' without a hash tag, so no other key can share its cluster slot", streamKey)
	}
	return "{" + streamKey + "}", nil
}

// hasHashTag reports whether a cluster hashes only part of key: a '{'
// followed, later, by a '}' with at least one byte between them.
func hasHashTag(key string) bool { return slot.HasTag(key) }

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
func (p *Publisher) publishDelayed(topic, key string, msgs []*message.Message, plan delayPlan) error {
	fail := func(err error) error {
		return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
	}
	if plan.err != nil {
		return fail(plan.err)
	}
	delayedKey, err := DelayedKey(key)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := publishContext(msgs)
	defer cancel()
	trim, _, err := p.trimmingOf(ctx, topic)
	if err != nil {
		p.failover.Failed(p.config.Client, err)
		return fail(err)
	}
	trimBy, trimTo := trim.by()
	args := make([]any, 0, 3+2*len(msgs))
	args = append(args, trimBy, trimTo, trim.mode)
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
	if err := p.combiners.wait.runScript(ctx, p.config.Client, key, delayAddScript, []string{delayedKey, key}, args...); err != nil {
		p.failed(err)
		if errors.Is(err, ErrNotReplicated) {
			return fail(err)
		}
		return fail(fmt.Errorf("storing %d delayed messages in %q (and %d due now in %q): %w",
			plan.delayed, delayedKey, len(msgs)-plan.delayed, key, err))
	}
	delayed.Notify(key) // the Subscribers of this process look at once
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
// returns them, into the one string that the scripts decode (see
// delayed.EncodeEntry). A field of a type the encoding has no form for is
// an error wrapping ErrInvalidMessage.
func encodeDelayedEntry(fields []any) (string, error) {
	member, err := delayed.EncodeEntry(fields)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	return member, nil
}

// delayAddScript writes the messages of one Publish call. For each pair of
// ARGV[4...] (wait in milliseconds, encoded entry): a wait of 0 appends the
// entry to the stream, trimmed as ARGV[1] ("MAXLEN", "MINID" or "") and
// ARGV[2] say, in the mode of ARGV[3] ("ACKED" or ""); a positive wait adds the entry to the sorted set, scored by
// the server's time in milliseconds (rounded up) plus the wait. An entry
// already waiting keeps its due time. It returns how many messages were
// written.
//
// KEYS[1] sorted set of delayed entries, KEYS[2] stream.
var delayAddScript = redis.NewScript(delayed.DecodeEntryLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.ceil(tonumber(t[2]) / 1000)
for i = 4, #ARGV, 2 do
  local wait = tonumber(ARGV[i])
  if wait > 0 then
    redis.call('ZADD', KEYS[1], 'NX', now + wait, ARGV[i + 1])
  elseif ARGV[1] == '' then
    redis.call('XADD', KEYS[2], '*', unpack(fields(ARGV[i + 1])))
  elseif ARGV[3] ~= '' then
    redis.call('XADD', KEYS[2], ARGV[3], ARGV[1], '~', ARGV[2], '*', unpack(fields(ARGV[i + 1])))
  else
    redis.call('XADD', KEYS[2], ARGV[1], '~', ARGV[2], '*', unpack(fields(ARGV[i + 1])))
  end
end
return (#ARGV - 3) / 2
`)

// delayedMoves is a Subscriber's mover of due delayed messages (see
// internal/delay): made, and its goroutine started, by the first call of
// startDelayedMover that adds a stream to it.
type delayedMoves struct {
	once  sync.Once
	mover *delayed.Mover
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
	m.once.Do(func() {
		m.mover = delayed.NewMover(delayed.Config{
			Client:  s.config.Client,
			Every:   every,
			Idle:    max(s.config.DelayedIdlePollInterval, 0),
			Faults:  &s.stats.Faults,
			Backoff: loop.Backoff,
		})
		// The subscription holds a count already, so Close cannot be past Wait.
		s.spawn(func() { m.mover.Run(s.life.closing) })
	})
	m.mover.Add(ctx, key, delayedKey, s.logger.With(logFields))
}
