package partition

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/loop"
)

// Token is one ownership of a partition: the member that owns it and the
// epoch of the acquisition, which grows with every acquisition of the
// partition in its group, so that no two ownerships share a token.
type Token struct {
	Member string
	Epoch  int64
}

// String returns the token as the owner record holds it:
// "<member>:<epoch>".
func (t Token) String() string { return t.Member + ":" + strconv.FormatInt(t.Epoch, 10) }

// parseToken reads an owner record; the member is what comes before the
// last ':'.
func parseToken(s string) (Token, error) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ':' {
			e, err := strconv.ParseInt(s[i+1:], 10, 64)
			if err != nil {
				break
			}
			return Token{Member: s[:i], Epoch: e}, nil
		}
	}
	return Token{}, fmt.Errorf("partition: owner record %q is not <member>:<epoch>", s)
}

// Partition is one partition of a topic in one consumer group: its owner
// record, its epoch counter and its stream (see [Layout.Keys]).
type Partition struct {
	client redis.UniversalClient
	keys   Keys
	group  string
}

// NewPartition returns the partition of keys in group, through client.
func NewPartition(client redis.UniversalClient, keys Keys, group string) *Partition {
	return &Partition{client: client, keys: keys, group: group}
}

// Keys returns the partition's keys.
func (p *Partition) Keys() Keys { return p.keys }

// Group returns the consumer group.
func (p *Partition) Group() string { return p.group }

// CreateGroup creates the group on the partition's stream, and the stream
// if need be, starting after the id start ("$": the last entry now; "0":
// the start), unless the group exists (BUSYGROUP), whatever its position.
// It needs no ownership: it only ever creates.
func (p *Partition) CreateGroup(ctx context.Context, start string) error {
	err := p.client.XGroupCreateMkStream(ctx, p.keys.Stream, p.group, start).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("partition: creating group %q on stream %q at %q: %w", p.group, p.keys.Stream, start, err)
	}
	return nil
}

// HeldError is the error of an Acquire of a partition that has an owner.
// It wraps ErrHeld.
type HeldError struct {
	Key    string        // the owner record
	Holder Token         // its owner
	TTL    time.Duration // the time left before the record lapses; negative: it never does
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("partition: %q is held by %s for %s more; it is acquired once its owner releases it or the record lapses",
		e.Key, e.Holder, e.TTL)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// Acquire takes the partition for member when it has no owner (never had
// one, was released, or its record lapsed), for ttl: the epoch counter
// grows, and the ownership returned has the new epoch. When another
// ownership holds it the error is a *HeldError (wrapping ErrHeld). member is
// also the owner's consumer name in the partition stream's group; it may
// hold any character (the epoch follows the record's last ':').
func (p *Partition) Acquire(ctx context.Context, member string, ttl time.Duration) (*Ownership, error) {
	sent := time.Now()
	reply, err := acquireScript.Run(ctx, p.client, []string{p.keys.Owner, p.keys.Epoch}, member, ttl.Milliseconds()).Slice()
	if err != nil {
		return nil, fmt.Errorf("partition: acquiring %q: %w", p.keys.Owner, err)
	}
	if len(reply) == 2 && reply[0] == int64(1) {
		epoch, ok := reply[1].(int64)
		if ok {
			return newOwnership(p, Token{Member: member, Epoch: epoch}, ttl, sent), nil
		}
	}
	if len(reply) == 3 && reply[0] == int64(0) {
		record, _ := reply[1].(string)
		pttl, _ := reply[2].(int64)
		holder, err := parseToken(record)
		if err != nil {
			return nil, err
		}
		return nil, &HeldError{Key: p.keys.Owner, Holder: holder, TTL: time.Duration(pttl) * time.Millisecond}
	}
	return nil, fmt.Errorf("partition: unexpected reply %v to the acquisition of %q", reply, p.keys.Owner)
}

// Holder returns the partition's owner and the time left before its record
// lapses, or ok false when it has none.
func (p *Partition) Holder(ctx context.Context) (t Token, ttl time.Duration, ok bool, err error) {
	pipe := p.client.Pipeline()
	get := pipe.Get(ctx, p.keys.Owner)
	pttl := pipe.PTTL(ctx, p.keys.Owner)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	record, err := get.Result()
	if errors.Is(err, redis.Nil) {
		return Token{}, 0, false, nil
	}
	if err != nil {
		return Token{}, 0, false, fmt.Errorf("partition: reading %q: %w", p.keys.Owner, err)
	}
	if t, err = parseToken(record); err != nil {
		return Token{}, 0, false, err
	}
	return t, pttl.Val(), true, nil
}

// Ownership is a member's ownership of a partition, from Acquire, with the
// calls only the owner makes. Each is checked against the owner record on
// the server in the same atomic step as its effect: once the ownership is
// lost (the record lapsed, and maybe another member acquired the
// partition), every call returns an error wrapping ErrFenced and changes
// nothing. An Ownership is safe for concurrent use.
type Ownership struct {
	p     *Partition
	token Token
	ttl   time.Duration
	// until is when the record lapses at the earliest, by this host's
	// monotonic clock, in nanoseconds since monoBase: the send time of the
	// acquisition or of the last renewal that succeeded, plus the TTL. The
	// monotonic clock, not the wall clock, so that a step of the system
	// clock neither lengthens nor shortens an ownership.
	until atomic.Int64
}

// monoBase is the origin of Ownership.until: a reading of the monotonic
// clock, taken once.
var monoBase = time.Now()

// setUntil records that the record lapses at the earliest ttl after sent,
// a time read with time.Now.
func (o *Ownership) setUntil(sent time.Time, ttl time.Duration) {
	o.until.Store(int64(sent.Add(ttl).Sub(monoBase)))
}

// newOwnership returns the ownership of token on p, whose record was
// written with ttl by a call sent at sent.
func newOwnership(p *Partition, token Token, ttl time.Duration, sent time.Time) *Ownership {
	o := &Ownership{p: p, token: token, ttl: ttl}
	o.setUntil(sent, ttl)
	return o
}

// Until returns the earliest time the owner record may lapse: after it,
// another member may own the partition, whatever this one's calls found.
// It carries a monotonic clock reading: compare it with time.Now.
func (o *Ownership) Until() time.Time { return monoBase.Add(time.Duration(o.until.Load())) }

// Token returns the ownership's token.
func (o *Ownership) Token() Token { return o.token }

// Partition returns the partition owned.
func (o *Ownership) Partition() *Partition { return o.p }

// TTL returns the time to live that Renew gives the owner record.
func (o *Ownership) TTL() time.Duration { return o.ttl }

// fenced is the error of op when the ownership is lost.
func (o *Ownership) fenced(op string) error {
	return fmt.Errorf("%w: %s on %q as %s refused; stop handling the partition, whose entries are another owner's now",
		ErrFenced, op, o.p.keys.Stream, o.token)
}

// Renew extends the ownership by its TTL. If the record had lapsed and
// nobody acquired the partition since, it is written again, and retaken is
// true (the calls refused meanwhile changed nothing). Otherwise a lost
// ownership is an error wrapping ErrFenced.
func (o *Ownership) Renew(ctx context.Context) (retaken bool, err error) {
	sent := time.Now()
	state, err := renewScript.Run(ctx, o.p.client, []string{o.p.keys.Owner, o.p.keys.Epoch},
		o.token.String(), o.ttl.Milliseconds(), o.token.Epoch).Int64()
	switch {
	case err != nil:
		return false, fmt.Errorf("partition: renewing %q: %w", o.p.keys.Owner, err)
	case state == 0:
		return false, o.fenced("renewal")
	}
	o.setUntil(sent, o.ttl)
	return state == 2, nil
}

// Adopt returns the ownership of the record token holds on p, written by
// this member with ttl in a call whose reply was lost: so that it can be
// released.
func (p *Partition) Adopt(token Token, ttl time.Duration) *Ownership {
	return newOwnership(p, token, ttl, time.Time{})
}

// Release deletes the owner record, so that the next member acquires the
// partition at once: call it once the owner has stopped handling it, its
// last Acks sent (what it leaves pending is handed over). A lost ownership
// is an error wrapping ErrFenced.
func (o *Ownership) Release(ctx context.Context) error {
	n, err := releaseScript.Run(ctx, o.p.client, []string{o.p.keys.Owner}, o.token.String()).Int64()
	if err != nil {
		return fmt.Errorf("partition: releasing %q: %w", o.p.keys.Owner, err)
	}
	if n == 0 {
		return o.fenced("release")
	}
	return nil
}

// HandedOver is what one call of HandOver moved.
type HandedOver struct {
	// Next is the cursor to go on from; "0-0": the pending list was scanned
	// to its end, and every entry pending then is the owner's now.
	Next string
	// Moved counts the entries moved (with Redis 6.2, those whose bodies
	// are gone too).
	Moved int64
	// Deleted are the ids of moved entries whose bodies were gone: the
	// server dropped them from the pending list (Redis 7 and later).
	Deleted []string
}

// HandOver moves the pending entries of the group on the partition's
// stream, whoever holds them (the previous owners, who left them), to the
// owner's consumer name, from the cursor from ("0-0": the start), up to
// about most entries per call. Call it from "0-0" after Acquire, and again
// from each Next until Next is "0-0", before reading new entries; then read
// the own pending entries (Read from "0"): they come in stream order, each
// one's delivery count grown by that read. The move itself leaves the
// counts alone, so that a count is the number of reads that delivered the
// entry.
func (o *Ownership) HandOver(ctx context.Context, from string, most int64) (HandedOver, error) {
	rest, err := o.run(ctx, "hand-over", handOverScript, o.args(from, most))
	if err != nil {
		return HandedOver{}, err
	}
	return parseHandOver(rest)
}

// Prune removes from the group the consumers other than the owner that hold
// nothing pending (after a hand-over: every previous owner), and returns how
// many it removed.
func (o *Ownership) Prune(ctx context.Context) (int64, error) {
	rest, err := o.run(ctx, "prune", pruneScript, o.args())
	if err != nil {
		return 0, err
	}
	return parseCount(rest)
}

// Read reads up to count entries with XREADGROUP, without blocking: new
// entries when from is ">", else the owner's own pending entries after the
// id from ("0": from the start). An entry whose body is gone has nil
// Fields.
func (o *Ownership) Read(ctx context.Context, from string, count int64) ([]loop.Entry, error) {
	rest, err := o.run(ctx, "read", readScript, o.args(count, from))
	if err != nil {
		return nil, err
	}
	return parseRead(rest)
}

// Ack acknowledges ids and returns how many were pending.
func (o *Ownership) Ack(ctx context.Context, ids []string) (int64, error) {
	rest, err := o.run(ctx, "ack", ackScript, o.groupArgs(ids))
	if err != nil {
		return 0, err
	}
	return parseCount(rest)
}

// Hold resets the idle time of ids pending for the owner, and returns each
// one's delivery count (-1: its body is gone; 0: it is not pending for the
// owner), as loop.Server's Hold.
func (o *Ownership) Hold(ctx context.Context, ids []string) ([]int64, error) {
	rest, err := o.run(ctx, "hold", holdScript, o.args(toAny(ids)...))
	if err != nil {
		return nil, err
	}
	return parseCounts(rest, len(ids))
}

// ClaimBack claims the Nacked entry id again for the owner, growing its
// delivery count, while its count is still count, as loop.Server's
// ClaimBack.
func (o *Ownership) ClaimBack(ctx context.Context, id string, count int64) (loop.ClaimedBack, error) {
	rest, err := o.run(ctx, "nack claim", claimBackScript, o.args(id, count))
	if err != nil {
		return loop.ClaimedBack{}, err
	}
	return loop.ParseClaimBack(rest)
}

// HandBack resets the idle time of ids to idle, on the owner's own name,
// leaving their delivery counts alone (XCLAIM ... IDLE ... JUSTID).
func (o *Ownership) HandBack(ctx context.Context, ids []string, idle time.Duration) error {
	args := o.args(append([]any{idle.Milliseconds()}, toAny(ids)...)...)
	_, err := o.run(ctx, "hand-back", handBackScript, args)
	return err
}

// args are the arguments of a fenced script of the owner's consumer: the
// token, the group and the consumer name, then more.
func (o *Ownership) args(more ...any) []any {
	return append([]any{o.token.String(), o.p.group, o.token.Member}, more...)
}

// groupArgs are the token, the group, then ids.
func (o *Ownership) groupArgs(ids []string) []any {
	return append([]any{o.token.String(), o.p.group}, toAny(ids)...)
}

// keys are the keys of a fenced script.
func (o *Ownership) keys() []string { return []string{o.p.keys.Owner, o.p.keys.Stream} }

// run runs the fenced script s, and returns its reply after the 'ok'.
func (o *Ownership) run(ctx context.Context, op string, s *redis.Script, args []any) ([]any, error) {
	return o.check(op, s.Run(ctx, o.p.client, o.keys(), args...))
}

// check reads the reply of a fenced script: the error of the server, an
// error wrapping ErrFenced, or what follows the 'ok'. The server's error
// comes as it came (NOGROUP included), for loop's classifiers.
func (o *Ownership) check(op string, cmd *redis.Cmd) ([]any, error) {
	reply, err := cmd.Slice()
	if err != nil {
		return nil, err
	}
	var status string
	if len(reply) > 0 {
		status, _ = reply[0].(string)
	}
	switch status {
	case "fenced":
		return nil, o.fenced(op)
	case "ok":
		return reply[1:], nil
	}
	return nil, fmt.Errorf("partition: unexpected reply %v to the %s on %q", reply, op, o.p.keys.Stream)
}

func toAny(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
