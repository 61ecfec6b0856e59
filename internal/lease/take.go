package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// takeScript takes the lease if it is free (1), or returns its holder's
// token and remaining time to live in milliseconds (-1: it never expires).
//
// KEYS[1] lease key, ARGV[1] token, ARGV[2] TTL in milliseconds.
var takeScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
`)

// First is the first try of the lease on the base name, queued on a
// pipeline with other commands: once the pipeline has run, either Take goes
// on from its reply, or Abandon gives up the subscription's lease. Only one
// of them is called, once.
type First struct {
	cfg   Config
	lease *Lease
	reply *redis.Cmd
}

// QueueFirst queues on pipe the first try of the lease on cfg.Consumer (a
// run of the take script with its body, so that the server has it cached
// for the tries that follow). The caller runs pipe, then calls Take or
// Abandon.
func QueueFirst(ctx context.Context, pipe redis.Pipeliner, cfg Config, deps Deps) *First {
	l := newLease(cfg, deps, indexedName(cfg.Consumer, 1))
	// Known before the lease is asked for (see take).
	addLiveToken(l.token)
	reply := takeScript.Eval(ctx, pipe, []string{l.key}, l.token, l.ttl.Milliseconds())
	return &First{cfg: cfg, lease: l, reply: reply}
}

// Take takes a lease on the first consumer name, of Consumer, Consumer-2,
// Consumer-3, ..., whose lease is free. It never waits: a name leased by a
// subscription that stopped without Close is skipped like one held by a
// live subscription, and the subscription's Adopter takes over its pending
// entries once the lease lapses. The first try of Consumer is the
// pipeline's. An error is the one Deps.TakeError makes of the failure.
func (f *First) Take(ctx context.Context) (*Lease, error) {
	l, sent := f.lease, f.reply
	for n := 1; ; n++ {
		if n > 1 {
			l, sent = newLease(f.cfg, l.deps, indexedName(f.cfg.Consumer, n)), nil
		}
		taken, err := l.take(ctx, sent)
		if err != nil {
			return nil, l.deps.TakeError(l.name, err)
		}
		if taken {
			return l, nil
		}
	}
}

// Abandon gives up the lease of a subscription that does not start: it
// deletes the lease if the pipeline's try took it, and forgets its token.
func (f *First) Abandon() {
	if _, _, taken, _ := parseTake(f.reply); taken {
		close(f.lease.stopped) // no keeper ran
		f.lease.release()      // which forgets the token too
		return
	}
	dropLiveToken(f.lease.token)
}

// take takes l if it is free, and reports false when another subscription
// holds it: a sibling in this process, a subscription elsewhere, alive or
// dead (a process that stopped without Close keeps its lease until it
// lapses). Nobody waits for a lapse: the search goes on to the next name at
// once, and the Adopter of the subscription takes over the entries of a
// holder that turns out dead (adopt.go). sent, when not nil, is its first
// try, already sent.
func (l *Lease) take(ctx context.Context, sent *redis.Cmd) (bool, error) {
	logger := l.deps.Logger
	fields := watermill.LogFields{"consumer": l.name, "lease_key": l.key}
	// Known before the lease is asked for, so that a sibling that finds it
	// taken knows the holder is alive.
	addLiveToken(l.token)
	taken := false
	defer func() {
		if !taken {
			dropLiveToken(l.token)
		}
	}()
	for {
		if sent == nil {
			sent = l.try(ctx)
		}
		holder, pttl, ok, err := parseTake(sent)
		sent = nil
		if isOOM(err) {
			// The server is full (maxmemory) and refuses the new key. A
			// consumer restarted then is the one that must drain its
			// backlog, so a free name is used without its lease, and the
			// keeper takes the lease once the server accepts writes again
			// (keep.go); a held name goes the usual way.
			holder, pttl, err = l.peek(ctx)
			if err == nil && pttl == -2 {
				taken = true
				logger.Error("The server is out of memory (maxmemory) and refused the lease on the consumer name; the subscription starts without it and takes it as soon as the server accepts writes again. Until then a subscription of the same name elsewhere is not kept out",
					nil, fields)
				return true, nil
			}
		}
		if err != nil {
			return false, err
		}
		if ok {
			taken = true
			return true, nil
		}
		switch {
		case pttl == -2:
			continue // it lapsed between the two steps of the script's reply: ask again
		case isLiveToken(holder):
			// A sibling in this process: nothing to say.
		case pttl < 0:
			logger.Info("Consumer name is held by a lease without expiry; trying the next one", fields)
		default:
			logger.Info("Consumer name is leased elsewhere; trying the next one. If its holder stopped without Close, its pending entries are taken over once its lease lapses",
				watermill.LogFields{"consumer": l.name, "lease_key": l.key, "lease_ttl_left": time.Duration(pttl * int64(time.Millisecond)).String()})
		}
		return false, nil
	}
}

// try runs takeScript for the lease: it takes the lease if it is free (see
// parseTake).
func (l *Lease) try(ctx context.Context) *redis.Cmd {
	return takeScript.Run(ctx, l.deps.Client, []string{l.key}, l.token, l.ttl.Milliseconds())
}

// isOOM reports whether err is the server's refusal of a write for want of
// memory (maxmemory): an OOM reply, or, from a script on Redis 6.2, an
// error that wraps one ("ERR Error running script ...: -OOM ...").
func isOOM(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	return redis.HasErrorPrefix(err, "OOM") || strings.Contains(reply.Error(), "-OOM ")
}

// peek reads the lease without writing: its holder's token and its time to
// live in milliseconds (-2: there is none, as PTTL answers).
func (l *Lease) peek(ctx context.Context) (holder string, pttl int64, err error) {
	pipe := l.deps.Client.Pipeline()
	get := pipe.Get(ctx, l.key)
	ttl := pipe.PTTL(ctx, l.key)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if holder, err = get.Result(); errors.Is(err, redis.Nil) {
		holder, err = "", nil
	}
	if err != nil {
		return "", 0, err
	}
	d, err := ttl.Result()
	switch {
	case err != nil:
		return "", 0, err
	case d == -2 || holder == "":
		return "", -2, nil
	case d < 0:
		return holder, -1, nil
	}
	return holder, d.Milliseconds(), nil
}

// parseTake reads the reply of takeScript: taken, or the holder's token and
// the lease's remaining time to live in milliseconds.
func parseTake(cmd *redis.Cmd) (holder string, pttl int64, taken bool, err error) {
	reply, err := cmd.Result()
	if err != nil {
		return "", 0, false, err
	}
	if n, ok := reply.(int64); ok && n == 1 {
		return "", 0, true, nil
	}
	pair, ok := reply.([]any)
	if !ok || len(pair) != 2 {
		return "", 0, false, fmt.Errorf("unexpected reply %v to the lease request", reply)
	}
	holder, _ = pair[0].(string)
	pttl, ok = pair[1].(int64)
	if !ok {
		return "", 0, false, fmt.Errorf("unexpected reply %v to the lease request", reply)
	}
	return holder, pttl, false, nil
}
