package valkeystream

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/lease"
	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/partition"
	"github.com/echomq/valkeystream/internal/serverinfo"
)

// openGroup is the group door: XGROUP CREATE <key> <group> <start> MKSTREAM,
// where BUSYGROUP is success and every other reply an error.
func (s *Subscriber) openGroup(ctx context.Context, key string) error {
	err := s.config.Client.XGroupCreateMkStream(ctx, key, s.config.ConsumerGroup, s.config.Start.id()).Err()
	return s.doorError(ctx, key, err)
}

// doorError is nil for the door's success (BUSYGROUP included), else the
// *GroupCreateError for err. A full server (maxmemory) refuses XGROUP
// CREATE with OOM before it would answer BUSYGROUP: then the group is asked
// for with XINFO GROUPS, which only reads, and the door succeeds if it
// exists, so that a consumer restarted while the server is full drains its
// backlog.
func (s *Subscriber) doorError(ctx context.Context, key string, err error) error {
	group := s.config.ConsumerGroup
	if redis.HasErrorPrefix(err, "OOM") {
		groups, ierr := s.config.Client.XInfoGroups(ctx, key).Result()
		for _, g := range groups {
			if ierr == nil && g.Name == group {
				s.logger.Info("The server is out of memory (maxmemory) and refused XGROUP CREATE; the group exists, so the subscription starts",
					watermill.LogFields{"stream": key, "consumer_group": group})
				return nil
			}
		}
	}
	return doorError(key, group, err)
}

// openSubscription starts a group subscription to key in one round trip:
// one pipeline runs the group door, the server-side scripts of the loop
// with arguments that change nothing (loop.CheckScripts) (so that a client that may not run
// scripts fails here rather than at its first Nack, and so that the server
// has them cached: EVAL with the body, which needs no second round trip
// when the server does not know them yet), takes the lease on the base
// consumer name if it is free (lease.QueueFirst), and, the first time, asks
// which newer verbs the server has (serverinfo.DocsCommand). When another subscription
// holds that name, takeName goes on from there (see internal/lease). At a
// distance from the server the round trips of Subscribe are its time, and a
// router subscribes one handler after another.
//
// The same pipeline reads whether the server holds a partition count for
// topic (see partitioned.go): then nothing is leased, and the layout of
// that count is returned instead, for a partitioned subscription. The group
// door has run on key meanwhile, leaving there an empty stream with the
// group, which nothing reads.
func (s *Subscriber) openSubscription(ctx context.Context, topic, key string, logger watermill.LoggerAdapter) (*nameLease, *partition.Layout, error) {
	group, consumer := s.config.ConsumerGroup, s.config.Consumer
	pipe := s.config.Client.Pipeline()
	door := pipe.XGroupCreateMkStream(ctx, key, group, s.config.Start.id())
	scripts := loop.CheckScripts(ctx, pipe, key, group, consumer)
	first := lease.QueueFirst(ctx, pipe, s.leaseConfig(key), s.leaseDeps(key, logger))
	declared := pipe.Get(ctx, partition.DeclarationKey(key)) // see partitioned.go
	var docs *redis.Cmd                                      // which newer verbs the server has, asked once (verbs.go)
	if s.verbs.NeedsProbe() {
		docs = serverinfo.DocsCommand(ctx)
		_ = pipe.Process(ctx, docs)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if n, derr := declared.Result(); derr == nil {
		// Partitioned: what the pipeline did on key does not matter (a
		// user of a partitioned topic's ACL may be refused it).
		first.Abandon()
		l, err := s.partitions.discover(topic, key, n)
		return nil, l, err
	}
	err := s.doorError(ctx, key, door.Err())
	if err == nil {
		err = scriptsError(key, group, errors.Join(scripts[0].Err(), scripts[1].Err()))
	}
	if err == nil {
		err = s.checkVerbs(ctx, key, docs)
	}
	if err != nil {
		first.Abandon() // deletes the lease if the pipeline took it
		return nil, nil, err
	}
	// The pipeline's try is the lease's first: taken, or where the
	// search for a free name begins.
	held, err := s.takeName(ctx, key, first, logger)
	return held, nil, err
}

// doorError is nil for the door's success (BUSYGROUP included), else the
// *GroupCreateError for err.
func doorError(key, group string, err error) error {
	if err == nil || redis.HasErrorPrefix(err, "BUSYGROUP") {
		return nil
	}
	return &GroupCreateError{Key: key, Group: group, Err: err}
}

// scriptsError says what a failure of the script check means; a nil reply
// is the scripts' success.
func scriptsError(key, group string, err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return nil
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: the server refused to run the subscription's scripts (EVALSHA, EVAL); allow them for this client: %w",
			key, group, err)
	}
	return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: checking the subscription's scripts: %w", key, group, err)
}
