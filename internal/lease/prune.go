package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

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

// pruneEvery is how many prunes a subscription runs at most per age: a
// departed consumer goes within a quarter of the age after it is due, and a
// group of many subscriptions lists its consumers (XINFO CONSUMERS) rarely,
// not on every claim beat.
const pruneEvery = 4

// PruneConfig is what the pruner of one group subscription reads.
type PruneConfig struct {
	Stream, Group string
	// Self is the subscription's own consumer name, never removed.
	Self string
	// Age is how long a consumer must have been idle to be removed
	// (RemoveIdleConsumersAfter); negative: no consumer is removed.
	Age time.Duration
}

// Pruner removes the consumers of a group that left: those with no pending
// entries, idle for longer than the age, and whose name no subscription
// leases. A subscription's loop calls Prune on its claim beat, after its
// reclaim has taken the entries such consumers left idle.
type Pruner struct {
	cfg     PruneConfig
	client  redis.UniversalClient
	faults  *atomic.Int64 // counts the failed prunes
	logger  watermill.LoggerAdapter
	failing bool      // the last prune failed (logged once per streak)
	next    time.Time // no prune before this: see pruneEvery
}

// NewPruner returns the pruner of one group subscription, which removes
// consumers with client, counts its failures in faults and logs to logger.
func NewPruner(cfg PruneConfig, client redis.UniversalClient, faults *atomic.Int64, logger watermill.LoggerAdapter) *Pruner {
	return &Pruner{cfg: cfg, client: client, faults: faults, logger: logger}
}

// Prune removes departed consumers, at most pruneEvery times per age. A
// failure is counted and logged once per streak; it never disturbs the
// loop. A nil Pruner removes nothing.
func (p *Pruner) Prune(ctx context.Context) {
	if p == nil || p.cfg.Age < 0 {
		return
	}
	now := time.Now()
	if now.Before(p.next) {
		return
	}
	p.next = now.Add(p.cfg.Age / pruneEvery)
	removed, err := p.removeDeparted(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		p.faults.Add(1)
		if !p.failing {
			p.failing = true
			p.logger.Error("Removing departed consumers failed; retrying on the next claim beat. The client needs XINFO CONSUMERS and XGROUP DELCONSUMER, or set RemoveIdleConsumersAfter to NeverRemoveConsumers",
				err, nil)
		}
		return
	}
	p.failing = false
	if len(removed) > 0 {
		p.logger.Info("Removed departed consumers from the group", watermill.LogFields{"consumers": strings.Join(removed, ",")})
	}
}

// removeDeparted finds the consumers past the age with nothing pending,
// leaves out those whose name is leased, and removes the rest with
// pruneScript, which checks them again atomically.
func (p *Pruner) removeDeparted(ctx context.Context) ([]string, error) {
	stream, group, age := p.cfg.Stream, p.cfg.Group, p.cfg.Age
	consumers, err := p.client.XInfoConsumers(ctx, stream, group).Result()
	if err != nil {
		return nil, fmt.Errorf("listing the consumers of group %q on stream %q: %w", group, stream, err)
	}
	candidates := departedConsumers(consumers, age, p.cfg.Self)
	if len(candidates) == 0 {
		return nil, nil
	}
	pipe := p.client.Pipeline()
	leased := make([]*redis.IntCmd, len(candidates))
	for i, name := range candidates {
		leased[i] = pipe.Exists(ctx, Key(stream, group, name))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("reading the leases of idle consumers: %w", err)
	}
	args := []any{group, age.Milliseconds()}
	for i, name := range candidates {
		if leased[i].Val() == 0 {
			args = append(args, name)
		}
	}
	if len(args) == 2 {
		return nil, nil
	}
	removed, err := pruneScript.Run(ctx, p.client, []string{stream}, args...).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("removing idle consumers of group %q on stream %q: %w", group, stream, err)
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
