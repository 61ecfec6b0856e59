package valkeystream

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/lease"
)

// Consumer identity: a consumer name belongs to one live subscription at a
// time, in any process, through a lease on the server; and consumers that
// left and hold nothing pending are removed from the group. Both run in
// internal/lease, whose package comment states the layout of the lease key;
// this file hands it the Subscriber's settings.

// nameLease is a subscription's lease on its consumer name.
type nameLease struct {
	name string // the consumer name
	held *lease.Lease
	// heir takes over the pending entries of the other names of Consumer
	// whose holders stopped without Close (see lease.Adopter).
	heir *lease.Adopter
}

// leaseConfig is the part of the Subscriber's config the lease of a
// subscription to stream reads.
func (s *Subscriber) leaseConfig(stream string) lease.Config {
	return lease.Config{
		Stream:   stream,
		Group:    s.config.ConsumerGroup,
		Consumer: s.config.Consumer,
		TTL:      s.config.ConsumerLeaseTTL,
	}
}

// leaseDeps are what the lease of a subscription to stream is handed.
func (s *Subscriber) leaseDeps(stream string, logger watermill.LoggerAdapter) lease.Deps {
	return lease.Deps{
		Client: s.config.Client,
		Faults: &s.stats.Faults,
		Spawn:  s.spawn, // the subscription holds the count above zero, so Close cannot be past Wait
		Logger: logger,
		Pipes:  s.conns.pipes,
		TakeError: func(name string, err error) error {
			return s.leaseError(stream, name, err)
		},
	}
}

// takeName takes a lease on the first consumer name of stream, of
// Consumer, Consumer-2, Consumer-3, ..., that is free, going on from first,
// the try of Consumer sent with the group door (see openSubscription). It
// never waits: the entries of a name leased by a subscription that stopped
// without Close are taken over by the heir once the lease lapses.
func (s *Subscriber) takeName(ctx context.Context, stream string, first *lease.First, logger watermill.LoggerAdapter) (*nameLease, error) {
	held, err := first.Take(ctx)
	if err != nil {
		return nil, err
	}
	heir := lease.NewAdopter(s.leaseConfig(stream), s.leaseDeps(stream, logger), held.Name())
	return &nameLease{name: held.Name(), held: held, heir: heir}, nil
}

// leaseError says what a failure to take the lease on name means.
func (s *Subscriber) leaseError(stream, name string, err error) error {
	var reply redis.Error
	if errors.As(err, &reply) {
		return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: the server refused the lease on consumer name %q; allow GET, SET, PTTL, PEXPIRE and DEL on %q for this client (see the permissions in docs/design.md): %w",
			stream, s.config.ConsumerGroup, name, lease.Key(stream, s.config.ConsumerGroup, name), err)
	}
	return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: taking the lease on consumer name %q: %w",
		stream, s.config.ConsumerGroup, name, err)
}

// keepName starts the goroutine that renews the lease until ctx ends (cancel
// ends the subscription if the name is lost) and the heir's, and returns the release that
// the subscription's loop calls when it ends, after its last Acks and
// before it closes its channel: once the channel is closed the name is free,
// so that a subscription started right after (a router closed and run
// again) gets it, and with it the pending entries.
func (s *Subscriber) keepName(ctx context.Context, cancel context.CancelFunc, l *nameLease, logger watermill.LoggerAdapter) (release func()) {
	l.heir.Start(ctx, logger)
	return l.held.Keep(ctx, cancel, logger)
}

// newPruner returns the pruner of the group subscription to stream under
// the consumer name self (see lease.Pruner).
func (s *Subscriber) newPruner(stream, self string, logger watermill.LoggerAdapter) *lease.Pruner {
	// NeverRemoveConsumers is negative: the pruner removes nothing.
	cfg := lease.PruneConfig{Stream: stream, Group: s.config.ConsumerGroup, Self: self, Age: s.config.RemoveIdleConsumersAfter}
	return lease.NewPruner(cfg,
		s.config.Client, &s.stats.Faults, logger)
}
