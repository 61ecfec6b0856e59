package lease

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
)

const (
	// renewals is how many times a subscription renews its lease per TTL:
	// four renewals can fail before the lease lapses.
	renewals = 5
	// releaseTimeout bounds the release of a lease when a subscription
	// ends, whatever the client's options (see internal/bounded): a lease
	// not released lapses after its TTL.
	releaseTimeout = 200 * time.Millisecond
)

// renewScript extends the lease if it is still ours (1), takes it again if
// it lapsed and nobody took it meanwhile (2), or reports that another
// subscription holds it now (0).
//
// KEYS[1] lease key, ARGV[1] token, ARGV[2] TTL in milliseconds.
var renewScript = redis.NewScript(`
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

// releaseScript deletes the lease if it is still ours.
//
// KEYS[1] lease key, ARGV[1] token.
var releaseScript = redis.NewScript(releaseSource)

const releaseSource = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`

// Keep starts, through Deps.Spawn, the keeper goroutine that renews the
// taken lease until ctx ends, and returns the release that the
// subscription calls once when it ends. cancel ends the subscription: the
// keeper calls it when the name is lost, and the release calls it first, to
// end the keeper whatever ended the subscription; the release then waits
// for the keeper to return and deletes the lease if it is still ours, so
// that a new subscription gets the name at once. logger logs for the keeper
// and the release.
func (l *Lease) Keep(ctx context.Context, cancel context.CancelFunc, logger watermill.LoggerAdapter) (release func()) {
	l.deps.Logger = logger
	l.deps.Spawn(func() { l.keep(ctx, cancel) })
	return func() {
		cancel()
		l.release()
	}
}

// keep renews the lease every ttl/renewals until ctx ends. If another
// subscription holds the name now (renewals failed for longer than the TTL
// and it took the lapsed lease), keep logs it and calls lost, which ends the
// subscription.
func (l *Lease) keep(ctx context.Context, lost context.CancelFunc) {
	defer close(l.stopped)
	ticker := time.NewTicker(l.ttl / renewals)
	defer ticker.Stop()
	logger := l.deps.Logger
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		var state int64
		var err error
		if bounded.Call(ctx, func() {
			state, err = renewScript.Run(ctx, l.deps.Client, []string{l.key}, l.token, l.ttl.Milliseconds()).Int64()
		}) != nil {
			return // ctx ended
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.deps.Faults.Add(1)
			if !failing {
				failing = true
				logger.Error("Renewing the lease on the consumer name failed; retrying on the next beat. If it lapses meanwhile, another subscription may take the name and this one stops",
					err, watermill.LogFields{"lease_key": l.key})
			}
			continue
		}
		if failing {
			failing = false
			logger.Info("Renewing the lease on the consumer name works again", watermill.LogFields{"lease_key": l.key})
		}
		switch state {
		case 2:
			logger.Info("The lease on the consumer name had lapsed (renewals failed, or the server lost it); taken again",
				watermill.LogFields{"lease_key": l.key})
		case 0:
			l.deps.Faults.Add(1)
			logger.Error("Lost the consumer name: its lease lapsed and another subscription took it. This subscription stops reading and closes its channel; the other one drains this name's pending entries",
				nil, watermill.LogFields{"lease_key": l.key})
			dropLiveToken(l.token)
			lost()
			return
		}
	}
}

// sendRelease runs the release script: in a pipeline shared with the
// releases of other subscriptions ending at the same time when Deps.Pipes
// is set (EVAL with the source, so that none of them needs the script
// loaded first), else on its own.
func (l *Lease) sendRelease(ctx context.Context) error {
	if l.deps.Pipes == nil {
		return releaseScript.Run(ctx, l.deps.Client, []string{l.key}, l.token).Err()
	}
	cmd := redis.NewCmd(ctx, "eval", releaseSource, 1, l.key, l.token)
	l.deps.Pipes.Exec(ctx, []redis.Cmder{cmd})
	return cmd.Err()
}

// release waits for keep to return, then deletes the lease if it is still
// ours, so that a new subscription gets the name at once.
func (l *Lease) release() {
	<-l.stopped
	defer dropLiveToken(l.token)
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	var released error
	err := bounded.Call(ctx, func() { released = l.sendRelease(ctx) })
	if err == nil {
		err = released
	}
	if err != nil {
		l.deps.Faults.Add(1)
		l.deps.Logger.Error("Releasing the lease on the consumer name failed; a new subscription under this name waits up to ConsumerLeaseTTL for it",
			err, watermill.LogFields{"lease_key": l.key})
	}
}
