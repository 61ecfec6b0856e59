package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// Consumer identity: a consumer name belongs to one live subscription at a
// time, in any process, through a lease on the server; and consumers that
// left and hold nothing pending are removed from the group.
//
// The lease of name N of group G on stream S is a string key
// S + ":lease:" + G + ":" + N (a ':' or '%' in G is escaped as %3A or %25,
// so that no two groups share a key) holding a random token of the
// subscription, with a TTL. Every command touches one key, and every key
// begins with the stream key, so one ACL key pattern per topic covers them
// all; on a cluster a lease key shares the stream's slot only when the
// stream key has a hash tag, which no command needs.

const (
	// leaseRenewals is how many times a subscription renews its lease per
	// ConsumerLeaseTTL: four renewals can fail before the lease lapses.
	leaseRenewals = 5
	// leaseReleaseTimeout bounds the release of a lease when a subscription
	// ends.
	leaseReleaseTimeout = 5 * time.Second
)

// leaseKey returns the key of the lease on consumer name of group on stream.
func leaseKey(stream, group, name string) string {
	return stream + ":lease:" + groupEscaper.Replace(group) + ":" + name
}

var groupEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// indexedName returns the consumer name of index n (1 for the base name itself).
func indexedName(base string, n int) string {
	if n == 1 {
		return base
	}
	return base + "-" + strconv.Itoa(n)
}

// liveTokens are the tokens of the leases that subscriptions of this process
// hold or are taking, so that a name held by a sibling in this process is
// known to be alive without watching it.
var liveTokens = struct {
	sync.Mutex
	m map[string]struct{}
}{m: map[string]struct{}{}}

func addLiveToken(token string) {
	liveTokens.Lock()
	liveTokens.m[token] = struct{}{}
	liveTokens.Unlock()
}

func dropLiveToken(token string) {
	liveTokens.Lock()
	delete(liveTokens.m, token)
	liveTokens.Unlock()
}

func isLiveToken(token string) bool {
	liveTokens.Lock()
	defer liveTokens.Unlock()
	_, ok := liveTokens.m[token]
	return ok
}

// newLeaseToken returns a token no other lease has: the host and process
// that hold it (for whoever reads the key) and a random part.
func newLeaseToken() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + watermill.NewShortUUID()
}

// leaseTakeScript takes the lease if it is free (1), or returns its holder's
// token and remaining time to live in milliseconds (-1: it never expires).
//
// KEYS[1] lease key, ARGV[1] token, ARGV[2] TTL in milliseconds.
var leaseTakeScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
`)

// leaseRenewScript extends the lease if it is still ours (1), takes it again
// if it lapsed and nobody took it meanwhile (2), or reports that another
// subscription holds it now (0).
//
// KEYS[1] lease key, ARGV[1] token, ARGV[2] TTL in milliseconds.
var leaseRenewScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
`)

// leaseReleaseScript deletes the lease if it is still ours.
//
// KEYS[1] lease key, ARGV[1] token.
var leaseReleaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// holderVerdict is what watching another subscription's lease has shown.
type holderVerdict int

const (
	holderUnproven holderVerdict = iota // not renewed yet while watched
	holderAlive                         // renewed, or taken anew, while watched
	holderForever                       // the key never expires
)

// leaseWatch follows the holder of a lease across polls. A holder is alive
// when it renews its lease (the remaining time to live grows) or when a new
// holder appears between two polls; a holder that died stops renewing, so
// its lease only shrinks until it lapses.
type leaseWatch struct {
	seen   bool
	holder string
	pttl   int64
}

func (w *leaseWatch) observe(holder string, pttl int64) holderVerdict {
	if pttl < 0 {
		return holderForever
	}
	if !w.seen {
		w.seen, w.holder, w.pttl = true, holder, pttl
		return holderUnproven
	}
	if holder != w.holder || pttl > w.pttl {
		return holderAlive
	}
	w.pttl = pttl
	return holderUnproven
}

// nameLease is a subscription's lease on its consumer name. Its keeper
// goroutine (keep) renews it; release deletes it once keep has returned.
type nameLease struct {
	sub     *Subscriber
	key     string // the lease key
	name    string // the consumer name
	token   string
	ttl     time.Duration
	logger  watermill.LoggerAdapter
	stopped chan struct{} // closed when keep returns
}

// takeName takes a lease on the first consumer name, of Consumer,
// Consumer-2, Consumer-3, ..., that no live subscription holds. A name held
// by a subscription that stopped renewing it is waited for, up to
// ConsumerLeaseTTL, and taken once its lease lapses. first is the lease on
// Consumer, whose first try (firstTry, a call of leaseTakeScript) was sent
// with the group door (see openSubscription).
func (s *Subscriber) takeName(ctx context.Context, stream string, first *nameLease, firstTry *redis.Cmd, logger watermill.LoggerAdapter) (*nameLease, error) {
	lease, sent := first, firstTry
	for n := 1; ; n++ {
		if n > 1 {
			lease, sent = s.newLease(stream, indexedName(s.config.Consumer, n)), nil
		}
		taken, err := s.takeIndexed(ctx, lease, sent, logger)
		if err != nil {
			return nil, s.leaseError(stream, lease.name, err)
		}
		if taken {
			return lease, nil
		}
	}
}

// leaseError says what a failure to take the lease on name means.
func (s *Subscriber) leaseError(stream, name string, err error) error {
	var reply redis.Error
	if errors.As(err, &reply) {
		return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: the server refused the lease on consumer name %q; allow GET, SET, PTTL, PEXPIRE and DEL on %q for this client (see the permissions in docs/design.md): %w",
			stream, s.config.ConsumerGroup, name, leaseKey(stream, s.config.ConsumerGroup, name), err)
	}
	return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: taking the lease on consumer name %q: %w",
		stream, s.config.ConsumerGroup, name, err)
}

// newLease returns a lease on name, not taken yet, with a token of its own.
func (s *Subscriber) newLease(stream, name string) *nameLease {
	return &nameLease{
		sub:     s,
		key:     leaseKey(stream, s.config.ConsumerGroup, name),
		name:    name,
		token:   newLeaseToken(),
		ttl:     s.config.ConsumerLeaseTTL,
		stopped: make(chan struct{}),
	}
}

// takeIndexed takes lease, waiting for it while its holder is not proven
// alive, and reports false when a live subscription holds it. sent, when
// not nil, is its first try, already sent.
func (s *Subscriber) takeIndexed(ctx context.Context, lease *nameLease, sent *redis.Cmd, logger watermill.LoggerAdapter) (bool, error) {
	ttl := s.config.ConsumerLeaseTTL
	fields := watermill.LogFields{"consumer": lease.name, "lease_key": lease.key}
	// Known before the lease is asked for, so that a sibling that finds it
	// taken knows the holder is alive.
	addLiveToken(lease.token)
	taken := false
	defer func() {
		if !taken {
			dropLiveToken(lease.token)
		}
	}()

	poll := min(max(ttl/20, 10*time.Millisecond), 500*time.Millisecond)
	// A holder renews every ttl/leaseRenewals; one that has not renewed by
	// the time its lease should have lapsed has a longer TTL than ours.
	deadline := time.Now().Add(ttl + poll)
	var watch leaseWatch
	waiting := false
	for {
		if sent == nil {
			sent = lease.try(ctx)
		}
		holder, pttl, ok, err := parseLeaseTake(sent)
		sent = nil
		if err != nil {
			return false, err
		}
		if ok {
			taken = true
			if waiting {
				logger.Info("Took the consumer name after the lease of its previous holder lapsed", fields)
			}
			return true, nil
		}
		if pttl == -2 {
			continue // it lapsed between the two steps of the script's reply: ask again
		}
		if isLiveToken(holder) {
			return false, nil // a sibling in this process
		}
		switch watch.observe(holder, pttl) {
		case holderAlive:
			logger.Info("Consumer name is held by a live subscription elsewhere; trying the next one", fields)
			return false, nil
		case holderForever:
			logger.Info("Consumer name is held by a lease without expiry; trying the next one", fields)
			return false, nil
		}
		if time.Now().After(deadline) {
			logger.Info("Consumer name is still held after ConsumerLeaseTTL although its holder did not renew it (a holder with a longer ConsumerLeaseTTL?); trying the next one", fields)
			return false, nil
		}
		if !waiting {
			waiting = true
			logger.Info("Consumer name is leased by another subscription; waiting until it renews the lease (alive: the next name is taken) or the lease lapses (a process that stopped without Close: the name is taken)",
				watermill.LogFields{"consumer": lease.name, "lease_key": lease.key, "lease_ttl_left": time.Duration(pttl * int64(time.Millisecond)).String()})
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

// keepName starts the goroutine that renews lease until ctx ends (cancel
// ends the subscription if the name is lost), and returns the release that
// the subscription's loop calls when it ends, after its last Acks and
// before it closes its channel: once the channel is closed the name is free,
// so that a subscription started right after (a router closed and run
// again) gets it, and with it the pending entries.
func (s *Subscriber) keepName(ctx context.Context, cancel context.CancelFunc, lease *nameLease, logger watermill.LoggerAdapter) (release func()) {
	lease.logger = logger
	s.wg.Add(1) // the subscription holds the count above zero, so Close cannot be past Wait
	go func() {
		defer s.wg.Done()
		lease.keep(ctx, cancel)
	}()
	return func() {
		cancel() // ends the keeper, whatever ended the loop
		lease.release()
	}
}

// try runs leaseTakeScript for the lease: it takes the lease if it is free
// (see parseLeaseTake).
func (l *nameLease) try(ctx context.Context) *redis.Cmd {
	return leaseTakeScript.Run(ctx, l.sub.config.Client, []string{l.key}, l.token, l.ttl.Milliseconds())
}

// parseLeaseTake reads the reply of leaseTakeScript: taken, or the holder's
// token and the lease's remaining time to live in milliseconds.
func parseLeaseTake(cmd *redis.Cmd) (holder string, pttl int64, taken bool, err error) {
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

// keep renews the lease every ttl/leaseRenewals until ctx ends. If another
// subscription holds the name now (renewals failed for longer than the TTL
// and it took the lapsed lease), keep logs it and calls lost, which ends the
// subscription.
func (l *nameLease) keep(ctx context.Context, lost context.CancelFunc) {
	defer close(l.stopped)
	ticker := time.NewTicker(l.ttl / leaseRenewals)
	defer ticker.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		state, err := leaseRenewScript.Run(ctx, l.sub.config.Client, []string{l.key}, l.token, l.ttl.Milliseconds()).Int64()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.sub.stats.Faults.Add(1)
			if !failing {
				failing = true
				l.logger.Error("Renewing the lease on the consumer name failed; retrying on the next beat. If it lapses meanwhile, another subscription may take the name and this one stops",
					err, watermill.LogFields{"lease_key": l.key})
			}
			continue
		}
		if failing {
			failing = false
			l.logger.Info("Renewing the lease on the consumer name works again", watermill.LogFields{"lease_key": l.key})
		}
		switch state {
		case 2:
			l.logger.Info("The lease on the consumer name had lapsed (renewals failed, or the server lost it); taken again",
				watermill.LogFields{"lease_key": l.key})
		case 0:
			l.sub.stats.Faults.Add(1)
			l.logger.Error("Lost the consumer name: its lease lapsed and another subscription took it. This subscription stops reading and closes its channel; the other one drains this name's pending entries",
				nil, watermill.LogFields{"lease_key": l.key})
			dropLiveToken(l.token)
			lost()
			return
		}
	}
}

// release waits for keep to return, then deletes the lease if it is still
// ours, so that a new subscription gets the name at once.
func (l *nameLease) release() {
	<-l.stopped
	defer dropLiveToken(l.token)
	ctx, cancel := context.WithTimeout(context.Background(), leaseReleaseTimeout)
	defer cancel()
	if err := leaseReleaseScript.Run(ctx, l.sub.config.Client, []string{l.key}, l.token).Err(); err != nil {
		l.sub.stats.Faults.Add(1)
		l.logger.Error("Releasing the lease on the consumer name failed; a new subscription under this name waits up to ConsumerLeaseTTL for it",
			err, watermill.LogFields{"lease_key": l.key})
	}
}

// pruneScript removes the consumers named in ARGV[3...] that, checked again
// here, hold no pending entries and have been idle for more than ARGV[2]
// milliseconds, and returns the names it removed. The check and the removal
// are one atomic step: XGROUP DELCONSUMER deletes a consumer's pending list,
// so a consumer that took an entry since the caller looked is kept.
//
// KEYS[1] stream, ARGV[1] group, ARGV[2] idle milliseconds, ARGV[3...] names.
var pruneScript = redis.NewScript(`
local info = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if info.err then
  return info
end
local minIdle = tonumber(ARGV[2])
local departed = {}
for _, c in ipairs(info) do
  local f = {}
  for i = 1, #c, 2 do
    f[c[i]] = c[i + 1]
  end
  if f['pending'] == 0 and f['idle'] > minIdle then
    departed[f['name']] = true
  end
end
local removed = {}
for i = 3, #ARGV do
  if departed[ARGV[i]] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed[#removed + 1] = ARGV[i]
  end
end
return removed
`)

// pruner removes the consumers of a group that left: those with no pending
// entries, idle for longer than RemoveIdleConsumersAfter, and whose name no
// subscription leases. A subscription's loop calls prune on its claim beat,
// after its reclaim has taken the entries such consumers left idle.
type pruner struct {
	sub     *Subscriber
	stream  string
	group   string
	self    string
	age     time.Duration
	logger  watermill.LoggerAdapter
	failing bool      // the last prune failed (logged once per streak)
	next    time.Time // no prune before this: see pruneEvery
}

// pruneEvery is how many prunes a subscription runs at most per
// RemoveIdleConsumersAfter: a departed consumer goes within a quarter of the
// age after it is due, and a group of many subscriptions lists its
// consumers (XINFO CONSUMERS) rarely, not on every claim beat.
const pruneEvery = 4

func (s *Subscriber) newPruner(stream, self string, logger watermill.LoggerAdapter) *pruner {
	return &pruner{sub: s, stream: stream, group: s.config.ConsumerGroup, self: self,
		age: s.config.RemoveIdleConsumersAfter, logger: logger}
}

// prune removes departed consumers, at most pruneEvery times per age. A failure is counted and logged once per
// streak; it never disturbs the loop.
func (w *pruner) prune(ctx context.Context) {
	if w == nil || w.age == NeverRemoveConsumers {
		return
	}
	now := time.Now()
	if now.Before(w.next) {
		return
	}
	w.next = now.Add(w.age / pruneEvery)
	removed, err := w.removeDeparted(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		w.sub.stats.Faults.Add(1)
		if !w.failing {
			w.failing = true
			w.logger.Error("Removing departed consumers failed; retrying on the next claim beat. The client needs XINFO CONSUMERS and XGROUP DELCONSUMER, or set RemoveIdleConsumersAfter to NeverRemoveConsumers",
				err, nil)
		}
		return
	}
	w.failing = false
	if len(removed) > 0 {
		w.logger.Info("Removed departed consumers from the group", watermill.LogFields{"consumers": strings.Join(removed, ",")})
	}
}

// removeDeparted finds the consumers past the age with nothing pending,
// leaves out those whose name is leased, and removes the rest with
// pruneScript, which checks them again atomically.
func (w *pruner) removeDeparted(ctx context.Context) ([]string, error) {
	client := w.sub.config.Client
	consumers, err := client.XInfoConsumers(ctx, w.stream, w.group).Result()
	if err != nil {
		return nil, fmt.Errorf("listing the consumers of group %q on stream %q: %w", w.group, w.stream, err)
	}
	candidates := departedConsumers(consumers, w.age, w.self)
	if len(candidates) == 0 {
		return nil, nil
	}
	pipe := client.Pipeline()
	leased := make([]*redis.IntCmd, len(candidates))
	for i, name := range candidates {
		leased[i] = pipe.Exists(ctx, leaseKey(w.stream, w.group, name))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("reading the leases of idle consumers: %w", err)
	}
	args := []any{w.group, w.age.Milliseconds()}
	for i, name := range candidates {
		if leased[i].Val() == 0 {
			args = append(args, name)
		}
	}
	if len(args) == 2 {
		return nil, nil
	}
	removed, err := pruneScript.Run(ctx, client, []string{w.stream}, args...).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("removing idle consumers of group %q on stream %q: %w", w.group, w.stream, err)
	}
	return removed, nil
}

// departedConsumers returns the names of the consumers that hold no pending
// entries and have been idle for longer than age, except self.
func departedConsumers(consumers []redis.XInfoConsumer, age time.Duration, self string) []string {
	var names []string
	for _, c := range consumers {
		if c.Pending == 0 && c.Idle > age && c.Name != self {
			names = append(names, c.Name)
		}
	}
	return names
}
