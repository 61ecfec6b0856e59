package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
	"github.com/echomq/valkeystream/internal/loop"
)

// A subscription's loop runs in internal/loop: this file hands it the
// Subscriber's settings and what it reports to (its loop.Deps).

// loopConfig is the part of the Subscriber's config a loop of stream key
// reads, for consumer (empty in fan-out).
func (s *Subscriber) loopConfig(key, consumer string) loop.Config {
	c := &s.config
	return loop.Config{
		Stream:           key,
		Group:            c.ConsumerGroup,
		Consumer:         consumer,
		BatchSize:        c.BatchSize,
		PrefetchWindow:   c.PrefetchWindow,
		ReadAheadBytes:   c.ReadAheadBytes,
		BlockTime:        c.BlockTime,
		ClaimInterval:    c.ClaimInterval,
		ClaimMinIdle:     c.ClaimMinIdle,
		AckFlushInterval: c.AckFlushInterval,
		CloseGrace:       c.CloseGrace,
		NackDelay:        func(count int64) time.Duration { return nackDelay(c, count) },
	}
}

// newGroupLoop returns the loop of the group subscription of stream key
// under the consumer name that lease holds; cancel ends the subscription
// (when the name is lost).
func (s *Subscriber) newGroupLoop(ctx context.Context, cancel context.CancelFunc, key string, lease *nameLease,
	health *subscriptionHealth, logger watermill.LoggerAdapter, out chan *message.Message,
) *loop.Group {
	cfg := s.loopConfig(key, lease.name)
	pruner := s.newPruner(key, lease.name, logger)
	deps := loop.Deps{
		Server: loop.NewRedisServer(s.config.Client, loop.RedisServerOptions{
			Key: key, Group: cfg.Group, Consumer: cfg.Consumer,
			ClaimMinIdle: cfg.ClaimMinIdle, BlockTime: cfg.BlockTime,
			ClaimInReads: cfg.ClaimInterval != NoReclaim,
			DeleteAcked:  s.config.DeleteAcked,
			Hints:        &s.failover,
			Verbs:        s.serverVerbs,
			Forget:       s.verbs.Forget,
			Cached:       s.verbs.Cached,
			Pipes:        s.conns.pipes,
		}),
		Counters: &s.stats.Counters,
		Logger:   logger,
		Health:   health,
		Handling: s.groupHandling(deadSource{topic: key[len(s.config.KeyPrefix):], stream: key}, lease.name, logger),
		// Like the loop's own calls, these end when the subscription does,
		// whatever the client's options (see internal/bounded).
		Reopen: func(ctx context.Context) error {
			var err error
			if berr := bounded.Call(ctx, func() { err = s.openGroup(ctx, key) }); berr != nil {
				return berr
			}
			return err
		},
		Prune: func(ctx context.Context) { _ = bounded.Call(ctx, func() { pruner.Prune(ctx) }) },
		// Called once the loop's last round trip is done; after those of
		// the subscriptions that ended with it (see exits.go).
		Release: s.life.exits.around(ctx, s.keepName(ctx, cancel, lease, logger)),
		Inherit: lease.heir,
	}
	// A nil *Member must not become a non-nil loop.Waiter.
	if m := s.conns.shared.Join(ctx, lease.name, key); m != nil {
		deps.Shared = m
	}
	return loop.NewGroup(cfg, deps, out)
}

// deadSource is where a subscription's entries come from: the topic, whose
// dead-letter stream (its stream key plus DeadLetterSuffix) takes its dead
// letters, and the stream key it reads (a partition's, on a partitioned
// topic).
type deadSource struct{ topic, stream string }

// groupHandling is how a group subscription of consumer reading src
// decodes entries, and settles the ones no handler does.
func (s *Subscriber) groupHandling(src deadSource, consumer string, logger watermill.LoggerAdapter) loop.Handling {
	group := s.config.ConsumerGroup
	from := origin{stream: src.stream, group: group, consumer: consumer}
	return loop.Handling{
		Decode: func(e loop.Entry) (*message.Message, error) {
			o := from
			o.entryID = e.ID
			msg, err := decodeEntry(s.config.Unmarshaler, e.Fields, o)
			if err != nil {
				return nil, err
			}
			if g := msg.Metadata.Get(MetadataReplayGroup); g != "" && g != group {
				return nil, fmt.Errorf("%w: a replay for group %q", loop.ErrNotForThisGroup, g)
			}
			// Delivered to its group, a replay is a message like any
			// other: forwarded by the handler, it reaches every group.
			delete(msg.Metadata, MetadataReplayGroup)
			return msg, nil
		},
		NotForThisGroup: func() { s.stats.notForThisGroup.Add(1) },
		DeadLetter: func(ctx context.Context, e loop.Entry, count int64, decodeErr error) error {
			return s.deadLetterInvalid(ctx, src, consumer, e, count, decodeErr, logger)
		},
		GiveUp: func(ctx context.Context, msg *message.Message, count int64, reason string) error {
			return s.deadLetterGivenUp(ctx, src, consumer, msg, count, reason, logger)
		},
		Delivered: func(id string) { s.observe.delivered(src.stream, group, id) },
	}
}

// newFanOut returns the loop of the fan-out subscription of stream key that
// starts after the entry start.
func (s *Subscriber) newFanOut(key, start string, health *subscriptionHealth, logger watermill.LoggerAdapter, out chan *message.Message) *loop.FanOut {
	deps := loop.Deps{
		Counters: &s.stats.Counters,
		Logger:   logger,
		Health:   health,
		Handling: loop.Handling{
			Decode: func(e loop.Entry) (*message.Message, error) {
				return decodeEntry(s.config.Unmarshaler, e.Fields, origin{stream: key, entryID: e.ID})
			},
			Delivered: func(id string) { s.observe.delivered(key, "", id) },
		},
	}
	return loop.NewFanOut(s.loopConfig(key, ""), deps, loop.RedisRead(s.config.Client, key), start, out)
}

// fanOutConns counts the fan-out subscriptions of a Subscriber, each of
// which holds a connection of the user's client while its read blocks, and
// logs once when they hold the whole pool: every other command of the
// client then waits for a read to time out (BlockTime) before it gets a
// connection, a Subscribe included.
type fanOutConns struct {
	mu     sync.Mutex
	n      int
	warned bool
}

// hold counts a fan-out subscription of client starting.
func (f *fanOutConns) hold(client redis.UniversalClient, logger watermill.LoggerAdapter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	c, ok := client.(*redis.Client) // a cluster's pools are per node, a ring's per shard
	if !ok || f.warned || f.n < c.Options().PoolSize {
		return
	}
	f.warned = true
	logger.Error("Fan-out subscriptions hold every connection of the client's pool while their reads block: "+
		"the client's other commands wait up to BlockTime for one. Give the client a PoolSize above the number of fan-out subscriptions (docs/configuration.md, Client)",
		nil, watermill.LogFields{"fan_out_subscriptions": f.n, "pool_size": c.Options().PoolSize})
}

// release counts a fan-out subscription ended.
func (f *fanOutConns) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
}

// fanOutStart resolves where a fan-out subscription begins. StartNew is turned
// into the id of the last entry now, so that nothing added after Subscribe
// returns is missed.
func (s *Subscriber) fanOutStart(ctx context.Context, key string) (string, error) {
	n, declared, err := declaredCount(ctx, s.config.Client, key)
	switch {
	case err != nil:
		return "", fmt.Errorf("valkeystream: checking whether stream %q is a partitioned topic: %w", key, err)
	case declared:
		return "", fanOutPartitionedError(key[len(s.config.KeyPrefix):], key, n)
	}
	if s.config.Start == StartHead {
		return "0-0", nil
	}
	last, err := s.config.Client.XRevRangeN(ctx, key, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("valkeystream: reading the last entry of stream %q to start a fan-out subscription: %w", key, err)
	}
	if len(last) == 0 {
		return "0-0", nil
	}
	return last[0].ID, nil
}

// deadLetterInvalid copies an entry of stream key that cannot be decoded to
// the dead-letter stream, as a decodable message with its raw fields, the
// error and its origin (see invalidEntryRecord), and logs it; the loop then
// acknowledges it. If the copy fails, the entry stays pending and comes
// back with the next drain or reclaim. With NoDeadLetter it is only logged
// with its raw fields.
func (s *Subscriber) deadLetterInvalid(ctx context.Context, src deadSource, consumer string, e loop.Entry, count int64, decodeErr error, logger watermill.LoggerAdapter) error {
	if s.config.DeadLetterSuffix == NoDeadLetter {
		logger.Error("Entry cannot be decoded; acknowledged without a dead letter (DeadLetterSuffix is NoDeadLetter)", decodeErr,
			watermill.LogFields{"entry_id": e.ID, "fields": e.Fields})
		return nil
	}
	dest := s.config.KeyPrefix + src.topic + s.config.DeadLetterSuffix
	record := invalidEntryRecord(e.Fields, origin{
		topic:         src.topic,
		stream:        src.stream,
		entryID:       e.ID,
		group:         s.config.ConsumerGroup,
		consumer:      consumer,
		deliveryCount: strconv.FormatInt(count, 10),
	}, decodeErr)
	fields := watermill.LogFields{"entry_id": e.ID, "dead_letter_stream": dest, "message_uuid": record.UUID}
	if err := s.writeDeadLetter(ctx, dest, record); err != nil {
		logger.Error("Entry cannot be decoded, and copying it to the dead-letter stream failed; it stays pending",
			errors.Join(decodeErr, err), fields)
		return err
	}
	logger.Error("Entry cannot be decoded; copied to the dead-letter stream and acknowledged", decodeErr, fields)
	return nil
}

// deadLetterGivenUp copies msg, read from stream key and delivered count
// times, whose handler gave up on it (GiveUp, Reject), to the dead-letter
// stream, as the DeadLetter middleware's dead letter with reason as its
// error (see deadLetterRecord), and logs it; the loop then acknowledges
// it. If the copy fails, the entry stays pending and comes back through a
// claim. With NoDeadLetter it is only logged.
func (s *Subscriber) deadLetterGivenUp(ctx context.Context, src deadSource, consumer string, msg *message.Message, count int64, reason string, logger watermill.LoggerAdapter) error {
	fields := watermill.LogFields{"message_uuid": msg.UUID, "entry_id": msg.Metadata.Get(MetadataEntryID), "delivery_count": count, "reason": reason}
	if s.config.DeadLetterSuffix == NoDeadLetter {
		logger.Error("Message given up by its handler; acknowledged without a dead letter (DeadLetterSuffix is NoDeadLetter)", nil, fields)
		return nil
	}
	dest := s.config.KeyPrefix + src.topic + s.config.DeadLetterSuffix
	fields["dead_letter_stream"] = dest
	record := deadLetterRecord(msg, origin{
		topic:         src.topic,
		stream:        src.stream,
		entryID:       msg.Metadata.Get(MetadataEntryID),
		group:         s.config.ConsumerGroup,
		consumer:      consumer,
		deliveryCount: strconv.FormatInt(count, 10),
	}, reason)
	if err := s.writeDeadLetter(ctx, dest, record); err != nil {
		logger.Error("Message given up by its handler, and copying it to the dead-letter stream failed; it stays pending, to come back after ClaimMinIdle",
			err, fields)
		return err
	}
	logger.Error("Message given up by its handler; copied to the dead-letter stream and acknowledged", nil, fields)
	return nil
}

// writeDeadLetter appends record to the dead-letter stream dest, in
// DefaultMarshaler's layout.
func (s *Subscriber) writeDeadLetter(ctx context.Context, dest string, record *message.Message) error {
	values, err := DefaultMarshaler{}.Marshal("", record)
	if err != nil {
		return fmt.Errorf("valkeystream: encoding the dead letter of message %s for %q: %w", record.UUID, dest, err)
	}
	var addErr error
	if err := bounded.Call(ctx, func() { addErr = s.config.Client.XAdd(ctx, &redis.XAddArgs{Stream: dest, Values: values}).Err() }); err != nil {
		return err
	}
	if addErr != nil {
		return fmt.Errorf("valkeystream: writing the dead letter of message %s to stream %q (check that the key holds a stream or is free): %w",
			record.UUID, dest, addErr)
	}
	return nil
}
