package lease

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
)

// adoptBatch is how many pending entries one run of adoptScript moves.
const adoptBatch = 500

// adoptScript moves up to ARGV[4] pending entries of consumer ARGV[2] to
// consumer ARGV[3] with XCLAIM ... JUSTID, which grows no delivery count
// (the drain that delivers them grows it by one, as it would for their own
// consumer), and returns how many it listed and how many it moved: an entry
// deleted from the stream is dropped from the pending list by XCLAIM on
// Redis 7.0 and later. Listing and moving are one step, so an entry a peer
// reclaimed meanwhile is never taken from it.
//
// KEYS[1] stream, ARGV[1] group, ARGV[2] from, ARGV[3] to, ARGV[4] count.
var adoptScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', ARGV[4], ARGV[2])
if #p == 0 then
  return {0, 0}
end
local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0}
for _, e in ipairs(p) do
  args[#args + 1] = e[1]
end
args[#args + 1] = 'JUSTID'
local moved = redis.call(unpack(args))
return {#p, #moved}
`)

// Adopter takes over, for the subscription that holds the consumer name
// self, the pending entries of the other names of its base (Consumer,
// Consumer-2, ...) whose holders stopped without Close: a process killed
// and started again under the same Consumer runs under a free name at once
// (Take never waits), and gets what its predecessor held as soon as the
// predecessor's lease lapses.
//
// Its goroutine (Start) lists the group's consumers with pending entries
// (XPENDING) once, and watches the lease of each name of the base but self.
// A name whose lease is free, or lapses without a renewal, is taken with a
// lease of the Adopter's own, its pending entries are moved to self
// (adoptScript), Moved receives, and the lease is released. A name whose
// holder renews its lease, or that a new holder takes, is alive and keeps its
// entries; so is one a subscription of this process holds. The goroutine
// ends once every name is settled, or with its context.
type Adopter struct {
	cfg      Config
	self     string
	deps     Deps
	token    string
	moved    chan struct{}
	watching atomic.Bool
}

// NewAdopter returns the Adopter of the subscription that holds the name
// self of cfg.Consumer's names; Start starts it.
func NewAdopter(cfg Config, deps Deps, self string) *Adopter {
	a := &Adopter{cfg: cfg, self: self, deps: deps, token: newToken(), moved: make(chan struct{}, 1)}
	a.watching.Store(true)
	return a
}

// Start starts, through Deps.Spawn, the goroutine that watches the other
// names until ctx ends or every one is settled; logger logs for it.
func (a *Adopter) Start(ctx context.Context, logger watermill.LoggerAdapter) {
	a.deps.Logger = logger
	a.deps.Spawn(func() { a.run(ctx) })
}

// Moved receives after entries were moved to self: the subscription's loop
// then drains its own pending list again. Several moves may be reported by
// one receive.
func (a *Adopter) Moved() <-chan struct{} { return a.moved }

// Watching reports whether entries may still be moved to self.
func (a *Adopter) Watching() bool { return a.watching.Load() }

func (a *Adopter) run(ctx context.Context) {
	defer a.watching.Store(false)
	// A sibling of this process that finds a name the Adopter holds while
	// it moves its entries knows that the holder is alive.
	addLiveToken(a.token)
	defer dropLiveToken(a.token)
	poll := pollInterval(a.cfg.TTL)
	var names map[string]*watch // nil until the consumers were listed
	failing := false
	for {
		var err error
		if names == nil {
			names, err = a.predecessors(ctx)
		}
		for name, w := range names {
			done, verr := a.visit(ctx, name, w)
			if done {
				delete(names, name)
			}
			err = errors.Join(err, verr)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			a.deps.Faults.Add(1)
			if !failing {
				failing = true
				a.deps.Logger.Error("Watching the leases of other consumer names of this base failed; retrying. Until it works, entries of a name whose holder stopped without Close are reclaimed after ClaimMinIdle",
					err, nil)
			}
		} else {
			failing = false
		}
		if names != nil && len(names) == 0 {
			return
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// pollInterval is how often a lease is looked at while it is watched: a
// twentieth of the TTL, within 10 ms and 500 ms.
func pollInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/20, 10*time.Millisecond), 500*time.Millisecond)
}

// predecessors lists the names of the base, other than self, that hold
// pending entries, each with a watch of its own.
func (a *Adopter) predecessors(ctx context.Context) (map[string]*watch, error) {
	var p *redis.XPending
	var err error
	if berr := bounded.Call(ctx, func() { p, err = a.deps.Client.XPending(ctx, a.cfg.Stream, a.cfg.Group).Result() }); berr != nil {
		return nil, berr
	}
	if errors.Is(err, redis.Nil) {
		return map[string]*watch{}, nil
	}
	if err != nil {
		return nil, err
	}
	names := map[string]*watch{}
	for name, n := range p.Consumers {
		if n > 0 && name != a.self && isNameOf(a.cfg.Consumer, name) {
			names[name] = &watch{}
		}
	}
	return names, nil
}

// isNameOf reports whether name is one of base's names: base, base-2,
// base-3, ...
func isNameOf(base, name string) bool {
	if name == base {
		return true
	}
	digits, ok := strings.CutPrefix(name, base+"-")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(digits)
	return err == nil && n >= 2 && indexedName(base, n) == name
}

// visit looks at the lease of name once and reports whether name is
// settled: its entries moved to self, or its holder proven alive.
func (a *Adopter) visit(ctx context.Context, name string, w *watch) (bool, error) {
	key := Key(a.cfg.Stream, a.cfg.Group, name)
	var reply *redis.Cmd
	if berr := bounded.Call(ctx, func() {
		reply = takeScript.Run(ctx, a.deps.Client, []string{key}, a.token, a.cfg.TTL.Milliseconds())
	}); berr != nil {
		return false, berr
	}
	holder, pttl, taken, err := parseTake(reply)
	switch {
	case err != nil:
		return false, err
	case taken:
		err := a.adopt(ctx, name, key)
		return err == nil, err
	case pttl == -2:
		return false, nil // it lapsed between the two steps of the script's reply
	case isLiveToken(holder):
		return true, nil // a subscription of this process
	}
	switch w.observe(holder, pttl) {
	case holderAlive:
		a.deps.Logger.Debug("Consumer name is held by a live subscription; its pending entries stay with it",
			watermill.LogFields{"other_consumer": name})
		return true, nil
	case holderForever:
		return true, nil
	}
	return false, nil
}

// adopt moves the pending entries of name, whose lease the Adopter took, to
// self, renewing the lease between batches, and releases the lease.
func (a *Adopter) adopt(ctx context.Context, name, key string) error {
	defer a.release(key)
	fields := watermill.LogFields{"other_consumer": name}
	var moved, gone int64
	for batch := 0; ; batch++ {
		var state int64
		var reply []int64
		var err error
		if berr := bounded.Call(ctx, func() {
			if batch > 0 { // the lease must outlast the move
				state, err = renewScript.Run(ctx, a.deps.Client, []string{key}, a.token, a.cfg.TTL.Milliseconds()).Int64()
				if err != nil || state == 0 {
					return
				}
			}
			reply, err = adoptScript.Run(ctx, a.deps.Client, []string{a.cfg.Stream},
				a.cfg.Group, name, a.self, adoptBatch).Int64Slice()
		}); berr != nil {
			return berr
		}
		if err != nil {
			return err
		}
		if batch > 0 && state == 0 {
			// Another subscription took the name: what is left is its own.
			break
		}
		if len(reply) != 2 || reply[0] == 0 {
			break
		}
		moved += reply[1]
		gone += reply[0] - reply[1]
		select {
		case a.moved <- struct{}{}:
		default: // one is waiting already
		}
	}
	if moved > 0 {
		fields["entries"] = moved
		a.deps.Logger.Info("Took over the pending entries of a consumer name whose holder stopped without Close; they are delivered next", fields)
	}
	if gone > 0 {
		a.deps.Logger.Error("Pending entries of a consumer name whose holder stopped without Close had been trimmed or deleted from the stream; dropped from the pending list without delivery",
			nil, watermill.LogFields{"other_consumer": name, "entries": gone})
	}
	return nil
}

// release deletes the Adopter's lease on key if it is still its own, so
// that a subscription of that name can start at once.
func (a *Adopter) release(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var released error
	err := bounded.Call(ctx, func() { released = releaseScript.Run(ctx, a.deps.Client, []string{key}, a.token).Err() })
	if err == nil {
		err = released // written by the call only if it returned in time
	}
	if err != nil {
		a.deps.Faults.Add(1)
		a.deps.Logger.Error("Releasing the lease on a consumer name whose pending entries were taken over failed; it lapses after ConsumerLeaseTTL",
			err, watermill.LogFields{"lease_key": key})
	}
}

// verdict is what watching another subscription's lease has shown.
type verdict int

const (
	holderUnproven verdict = iota // not renewed yet while watched
	holderAlive                   // renewed, or taken anew, while watched
	holderForever                 // the key never expires
)

// watch follows the holder of a lease across polls. A holder is alive when
// it renews its lease (the remaining time to live grows) or when a new
// holder appears between two polls; a holder that died stops renewing, so
// its lease only shrinks until it lapses.
type watch struct {
	seen   bool
	holder string
	pttl   int64
}

func (w *watch) observe(holder string, pttl int64) verdict {
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
