package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/lease"
	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/partition"
)

// A subscription of a partitioned topic (see partitioned.go): a driver
// (internal/partition) makes it a member of its group's partitions, owns
// the partitions the even split gives it, and runs one loop per owned
// partition, fenced by the ownership, whose messages go to the
// subscription's one channel.

// PartitionStats are the counters of a Subscriber's subscriptions of
// partitioned topics (Subscriber.PartitionStats).
type PartitionStats struct {
	// Owned is a gauge: the partitions the subscriptions own now.
	Owned int64
	// Rebalances counts the beats whose split gave a subscription other
	// partitions than before.
	Rebalances int64
	// Acquired counts the partitions a subscription took; Released those it
	// gave back (after its in-flight message was settled, on a rebalance or
	// on Close); HandedOver the pending entries it took over from the
	// previous owners when it acquired them.
	Acquired, Released, HandedOver int64
	// Fenced counts ownerships found lost or given up: the server refused
	// a renewal, read or Ack (the subscription was frozen or cut off past
	// PartitionOwnerTTL while another took the partition over), or no
	// renewal had reached the server for nearly PartitionOwnerTTL by the
	// subscription's own clock, so that another may take it over. Either
	// way the subscription stopped handling the partition.
	Fenced int64
	// LateHandOvers counts messages a handler took after their partition's
	// ownership may have lapsed: the process was frozen (or stalled) while
	// it offered them, and completed the offer when it ran again. Each
	// one's context had ended by then (docs/partitions.md, "Fencing").
	LateHandOvers int64
}

// PartitionStats returns the counters of the Subscriber's subscriptions of
// partitioned topics.
func (s *Subscriber) PartitionStats() PartitionStats {
	c := &s.stats.partitions
	return PartitionStats{
		Owned: c.Owned.Load(), Rebalances: c.Rebalances.Load(),
		Acquired: c.Acquired.Load(), Released: c.Released.Load(), HandedOver: c.HandedOver.Load(),
		Fenced: c.Lost.Load(), LateHandOvers: c.Late.Load(),
	}
}

// declarePartitions makes sure the server holds l's partition count for
// topic: the first Publisher or Subscriber of a topic stores it, and one
// that declares another count gets an error naming both.
func declarePartitions(ctx context.Context, client redis.Scripter, topic string, l *partition.Layout) error {
	err := l.Declare(ctx, client)
	var mismatch *partition.CountMismatchError
	switch {
	case errors.As(err, &mismatch):
		return fmt.Errorf("%w: topic %q is declared with %d partitions on the server (key %q), this one with %d: every Publisher and Subscriber of a topic must declare one count; changing it is a migration (docs/partitions.md)",
			ErrPartitionCount, topic, mismatch.Declared, partition.DeclarationKey(l.Topic()), mismatch.Asked)
	case err != nil:
		return fmt.Errorf("valkeystream: declaring the partition count of topic %q: %w", topic, err)
	}
	return nil
}

// openPartitioned declares topic's partitions, runs the group door on each
// partition's stream, and leases the subscription's consumer name (its
// member id in the group), all at Subscribe, so that a group created at
// StartNew begins at Subscribe on every partition.
func (s *Subscriber) openPartitioned(ctx context.Context, topic string, l *partition.Layout, logger watermill.LoggerAdapter) (*lease.Lease, error) {
	if err := declarePartitions(ctx, s.config.Client, topic, l); err != nil {
		return nil, err
	}
	key := l.Topic()
	pipe := s.config.Client.Pipeline()
	streams := l.Streams()
	doors := make([]*redis.StatusCmd, len(streams))
	for i, stream := range streams {
		doors[i] = pipe.XGroupCreateMkStream(ctx, stream, s.config.ConsumerGroup, s.config.Start.id())
	}
	first := lease.QueueFirst(ctx, pipe, s.leaseConfig(key), s.leaseDeps(key, logger))
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, door := range doors {
		if err := s.doorError(ctx, streams[i], door.Err()); err != nil {
			first.Abandon()
			return nil, err
		}
	}
	return first.Take(ctx)
}

// subscribePartitioned starts a subscription of the partitioned topic of
// layout l, and returns its run.
func (s *Subscriber) subscribePartitioned(ctx context.Context, cancel context.CancelFunc, topic string, l *partition.Layout,
	health *subscriptionHealth, logFields watermill.LogFields, out chan *message.Message,
) (func(context.Context), error) {
	held, err := s.openPartitioned(ctx, topic, l, s.logger.With(logFields))
	if err != nil {
		return nil, err
	}
	logFields["consumer"] = held.Name()
	logFields["partitions"] = l.N()
	health.setConsumer(held.Name())
	return s.newPartitioned(ctx, cancel, topic, l, held, health, s.logger.With(logFields), out)
}

// newPartitioned returns the run of a subscription of the partitioned
// topic of layout l under the consumer name held: its driver, until ctx
// ends, with every partition's loop; cancel ends the subscription (when
// the name is lost).
func (s *Subscriber) newPartitioned(ctx context.Context, cancel context.CancelFunc, topic string, l *partition.Layout, held *lease.Lease,
	health *subscriptionHealth, logger watermill.LoggerAdapter, out chan *message.Message,
) (func(context.Context), error) {
	ttl := s.config.PartitionOwnerTTL
	member := held.Name()
	d, err := partition.NewDriver(s.config.Client, l, partition.DriverConfig{
		Group:    s.config.ConsumerGroup,
		Member:   member,
		Start:    s.config.Start.id(),
		OwnerTTL: ttl, // the beat and the membership's TTL follow from it
		Run: func(pctx context.Context, p partition.Owned) {
			s.runPartition(ctx, pctx, topic, member, p, health, logger, out)
		},
		Hints:    &s.failover,
		Waits:    waitsOf(s.config.Client),
		Counters: &s.stats.partitions,
		Logger:   logger,
	})
	if err != nil {
		held.Keep(ctx, cancel, logger)() // frees the name at once
		return nil, fmt.Errorf("valkeystream: subscribing to the partitions of topic %q: %w", topic, err)
	}
	health.setPartitions(l.Streams(), d.Owned)
	release := s.life.exits.around(ctx, held.Keep(ctx, cancel, logger))
	return func(ctx context.Context) {
		defer close(out)
		defer release()
		_ = d.Run(ctx) // returns once every partition's loop has ended
	}, nil
}

// clientWaits holds, per client value, the room for the blocking waits of
// the partitions its subscriptions own (see blockingWaits): the pool is the
// client's, shared by every Subscriber and Publisher on it. One small
// channel per client ever used with a partitioned topic.
var clientWaits sync.Map // redis.UniversalClient -> chan struct{}

// waitsOf returns the room for blocking waits on client.
func waitsOf(client redis.UniversalClient) chan struct{} {
	if w, ok := clientWaits.Load(client); ok {
		return w.(chan struct{})
	}
	w, _ := clientWaits.LoadOrStore(client, make(chan struct{}, blockingWaits(client)))
	return w.(chan struct{})
}

// blockingWaits is how many partitions of a client's subscriptions may wait
// for new entries at once, each holding a pooled connection in XREAD
// BLOCK: half its pool, so that subscriptions owning more partitions than
// that leave connections to their reads, Acks and renewals (the others
// poll once per BlockTime meanwhile).
func blockingWaits(client redis.UniversalClient) int {
	size := 0
	switch c := client.(type) {
	case *redis.Client:
		size = c.Options().PoolSize
	case *redis.ClusterClient:
		size = c.Options().PoolSize
	case *redis.Ring:
		size = c.Options().PoolSize
	}
	if size <= 0 {
		size = 16
	}
	return max(1, size/2)
}

// runPartition runs the loop of partition p while the subscription owns
// it (until pctx ends), and hands its messages over to out, fenced by the
// ownership (partition.HandOver: a message whose ownership may lapse is
// not handed over, and the contexts of those handed over end when it may).
// When the partition moves while the subscription goes on (a rebalance),
// it returns only once its last message was settled, however long its
// handler takes, so that the next owner never handles the partition
// alongside it.
func (s *Subscriber) runPartition(subCtx, pctx context.Context, topic, member string, p partition.Owned, health *subscriptionHealth,
	logger watermill.LoggerAdapter, out chan<- *message.Message,
) {
	stream := p.Ownership.Partition().Keys().Stream
	plog := logger.With(watermill.LogFields{"partition": p.Index, "partition_stream": stream})
	cfg := p.LoopConfig(s.loopConfig(stream, member))
	cfg.Ordered = true
	deps := loop.Deps{
		Server:   p.Server,
		Counters: &s.stats.Counters,
		Logger:   plog,
		Health:   health,
		Handling: s.groupHandling(deadSource{topic: topic, stream: stream}, member, plog),
		Reopen:   func(ctx context.Context) error { return p.Ownership.Partition().CreateGroup(ctx, p.Start) },
	}
	lctx, stop := context.WithCancel(pctx)
	defer stop()
	pout := make(chan *message.Message)
	g := loop.NewGroup(cfg, deps, pout)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		g.Run(lctx)
	}()
	index := strconv.Itoa(p.Index)
	partition.HandOver{
		Fence:  p.Fence,
		Out:    out,
		Stop:   stop,
		Mark:   func(msg *message.Message) { msg.Metadata.Set(MetadataPartition, index) },
		Late:   func() { s.stats.partitions.Late.Add(1) },
		Logger: plog,
	}.Run(lctx, subCtx, pout)
	<-ended
}

// MetadataPartition is set on every message of a partitioned topic: the
// index of its partition.
const MetadataPartition = "valkeystream_partition"
