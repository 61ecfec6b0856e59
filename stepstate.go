package valkeystream

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Step is the exactly-once step of one handling under [ExactlyOnce], as its
// handler sees it: the writes it adds to its own keys are applied in the
// same atomic step as its outputs and its input's acknowledgement, fenced
// the same way (see docs/reliability.md, "Writes in the step"). If the
// handling fails, or the step is superseded (the input was acknowledged
// already, or delivered again to this or another consumer), none of them is
// applied; if it commits, all of them are, once per input, however often
// the handler ran.
//
// Get it with [StepOf] from the handled message's context. A Step is safe
// for concurrent use; its writes are applied in the order they were added.
// Each method returns an error, and adds nothing, for a write that cannot
// join the step: after the handler returned, a key outside the input
// stream's cluster hash slot (wrapping [ErrNotAtomic]), a key the step
// already writes as another type, or a bad argument (wrapping
// [ErrInvalidWrite]). A write the server would refuse (a key of another
// type, an increment of a value that is no integer) fails the whole step
// before any of it is applied, with an error naming the key and the
// command.
//
// Reads are not part of the step: a handler that reads a key before it
// writes it reads what committed steps left. On a partitioned topic a
// partition's keys written only by its handler are read as the last step
// of that partition left them; elsewhere, guard with [Step.Expect] or
// [Step.ExpectField] (docs/reliability.md).
type Step struct {
	st *step
}

// StepOf returns the step of the handling whose context is ctx (the
// message's Context() inside a handler under ExactlyOnce), or an error
// wrapping ErrNotAtomic when ctx belongs to no such handling.
func StepOf(ctx context.Context) (*Step, error) {
	st, _ := ctx.Value(stepKey{}).(*step)
	if st == nil {
		return nil, fmt.Errorf("%w: the context is not of a handling under the ExactlyOnce middleware: state writes join a step only there (pass the handled message's Context())", ErrNotAtomic)
	}
	return &Step{st: st}, nil
}

// The key types of a step, one letter each (the script checks them).
const (
	keyStream = 's'
	keyZSet   = 'z'
	keyString = 'k'
	keyHash   = 'h'
	keySet    = 't'
	keyAny    = '*' // DEL and PEXPIRE: any type
)

var keyTypeNames = map[byte]string{
	keyStream: "stream", keyZSet: "sorted set", keyString: "string", keyHash: "hash", keySet: "set", keyAny: "key of any type",
}

// Set sets string key to value, with a time to live unless ttl is 0 (SET,
// with PX). A ttl of 0 removes a time to live the key had, as SET does.
func (s *Step) Set(key, value string, ttl time.Duration) error {
	if ttl < 0 {
		return s.invalid("SET", key, "ttl %s is negative: give 0 for no time to live", ttl)
	}
	if ttl > 0 {
		return s.write("SET", key, keyString, value, "PX", ceilMillis(ttl))
	}
	return s.write("SET", key, keyString, value)
}

// Del deletes key, whatever its type (DEL).
func (s *Step) Del(key string) error {
	return s.write("DEL", key, keyAny)
}

// IncrBy adds n to the integer in string key, a missing key counting as 0
// (INCRBY).
func (s *Step) IncrBy(key string, n int64) error {
	return s.write("INCRBY", key, keyString, n)
}

// Expire gives key a time to live of ttl, rounded up to a millisecond
// (PEXPIRE); a missing key stays missing.
func (s *Step) Expire(key string, ttl time.Duration) error {
	if ttl <= 0 {
		return s.invalid("PEXPIRE", key, "ttl %s: it must be positive (Del deletes a key)", ttl)
	}
	return s.write("PEXPIRE", key, keyAny, ceilMillis(ttl))
}

// HSet sets field of hash key to value (HSET).
func (s *Step) HSet(key, field, value string) error {
	return s.write("HSET", key, keyHash, field, value)
}

// HIncrBy adds n to the integer in field of hash key, a missing field
// counting as 0 (HINCRBY).
func (s *Step) HIncrBy(key, field string, n int64) error {
	return s.write("HINCRBY", key, keyHash, field, n)
}

// HDel deletes fields of hash key (HDEL).
func (s *Step) HDel(key string, fields ...string) error {
	if len(fields) == 0 {
		return s.invalid("HDEL", key, "no field given")
	}
	return s.write("HDEL", key, keyHash, argsOf(fields)...)
}

// ZAdd adds member to sorted set key with score, or sets the score of a
// member it has (ZADD).
func (s *Step) ZAdd(key string, score float64, member string) error {
	if math.IsNaN(score) {
		return s.invalid("ZADD", key, "score is NaN")
	}
	return s.write("ZADD", key, keyZSet, strconv.FormatFloat(score, 'g', -1, 64), member)
}

// ZRem removes members from sorted set key (ZREM).
func (s *Step) ZRem(key string, members ...string) error {
	if len(members) == 0 {
		return s.invalid("ZREM", key, "no member given")
	}
	return s.write("ZREM", key, keyZSet, argsOf(members)...)
}

// SAdd adds members to set key (SADD).
func (s *Step) SAdd(key string, members ...string) error {
	if len(members) == 0 {
		return s.invalid("SADD", key, "no member given")
	}
	return s.write("SADD", key, keySet, argsOf(members)...)
}

// SRem removes members from set key (SREM).
func (s *Step) SRem(key string, members ...string) error {
	if len(members) == 0 {
		return s.invalid("SREM", key, "no member given")
	}
	return s.write("SREM", key, keySet, argsOf(members)...)
}

// Expect makes the step commit only if string key holds value as the step
// begins, before any of its writes (a missing key holds ""). Otherwise the
// step writes nothing and the handling fails with an error wrapping
// [ErrStateChanged]: the message comes back, and its handler reads again.
// This is the guard of a read-modify-write where two handlings may
// interleave (a plain consumer group).
func (s *Step) Expect(key, value string) error {
	return s.write("EXPECT", key, keyString, value)
}

// ExpectField is Expect for field of hash key (a missing field holds "").
// A version field that every write of the hash increments makes a handler's
// read of the whole hash safe to write back.
func (s *Step) ExpectField(key, field, value string) error {
	return s.write("EXPECTF", key, keyHash, field, value)
}

// argsOf returns ss as arguments.
func argsOf(ss []string) []any {
	a := make([]any, len(ss))
	for i, v := range ss {
		a[i] = v
	}
	return a
}

func (s *Step) invalid(cmd, key, format string, args ...any) error {
	return fmt.Errorf("%w: %s of key %q: %s", ErrInvalidWrite, cmd, key, fmt.Sprintf(format, args...))
}

// write adds one write, cmd on key of type typ with args, to the step.
func (s *Step) write(cmd, key string, typ byte, args ...any) error {
	st := s.st
	if len(args) > maxStepWords-8 {
		return s.invalid(cmd, key, "%d arguments: a step takes at most %d per write", len(args), maxStepWords-8)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return fmt.Errorf("%w: %s of key %q after the handler of message entry %s returned: add state writes before returning", ErrNotAtomic, cmd, key, st.d.ID)
	}
	if err := st.stateSlot(cmd, key); err != nil {
		return err
	}
	i, err := st.key(key, typ)
	if err != nil {
		return fmt.Errorf("%s of key %q: %w", cmd, key, err)
	}
	st.w.ops = append(st.w.ops, cmd, i, len(args))
	st.w.ops = append(st.w.ops, args...)
	switch cmd {
	case "EXPECT", "EXPECTF":
		st.w.checks = true
	case "INCRBY", "HINCRBY":
		st.w.checks = true
		st.w.stateWrites++
	default:
		st.w.stateWrites++
	}
	return nil
}

// stateSlot refuses a state key outside the input stream's hash slot (or,
// on a ring, hash tag). Unlike an output, a state write has no plain way
// to fall back to, so NonAtomicFallback does not apply to it.
func (st *step) stateSlot(cmd, key string) error {
	if st.inInputSlot(key) {
		return nil
	}
	return fmt.Errorf("%w: %s of key %q: the key is not in the cluster hash slot of stream %q, so it cannot be written in one step with the input's Ack: give the state keys the input topic's hash tag, such as {accounts}:balance:42 for topic {accounts}.events",
		ErrNotAtomic, cmd, key, st.d.Stream)
}
