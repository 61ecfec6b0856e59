package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/partition"
)

// Partitioned topics (docs/partitions.md): a topic declared with n
// partitions is n streams, one per partition, each in a cluster hash slot
// of its own. A message goes to the partition of its key; within a consumer
// group each partition is handled by one live subscription at a time, in
// stream order, so the messages of one key are handled one after the other,
// in the order they were published.

// MetadataPartitionKey is the metadata key of a message's partition key on
// a partitioned topic, unless PublisherConfig.PartitionKey says otherwise:
// messages with the same key go to the same partition, and are handled in
// order. A message without one goes to the partition of its UUID: unkeyed
// messages spread evenly, without order, and a copy published again goes
// where the first went.
const MetadataPartitionKey = "valkeystream_partition_key"

// MaxPartitions is the largest partition count of a topic.
const MaxPartitions = partition.MaxPartitions

// PartitionOf returns the partition of key on a topic of n partitions:
// FNV-1a (32 bit) of the key's UTF-8 bytes, modulo n. A producer in another
// language routes alike with the same hash (docs/partitions.md).
func PartitionOf(key string, n int) int { return partition.Of(key, n) }

// PartitionStreams returns the stream keys of the partitions of the topic
// whose stream key (KeyPrefix plus topic) is stream, in partition order.
func PartitionStreams(stream string, n int) ([]string, error) {
	l, err := partition.NewLayout(stream, n)
	if err != nil {
		return nil, err
	}
	return l.Streams(), nil
}

// partitionedTopics are the layouts of a Publisher's or Subscriber's
// partitioned topics, those of its config and those found on the server,
// and whether their count was declared on the server.
type partitionedTopics struct {
	layouts    map[string]*partition.Layout // by topic, from the config
	discovered sync.Map                     // topic -> *partition.Layout, of a count found on the server
	declared   sync.Map                     // topic -> true once the server has its count
	plain      sync.Map                     // topic -> true once the server said it is not partitioned
}

// newPartitionedTopics returns the layouts of counts (topic -> partitions)
// on the stream keys prefix + topic; field names the config field, for
// errors.
func newPartitionedTopics(counts map[string]int, prefix, field string) (*partitionedTopics, error) {
	t := &partitionedTopics{layouts: map[string]*partition.Layout{}}
	for topic, n := range counts {
		if topic == "" {
			return nil, fmt.Errorf("%w: %s has an empty topic", ErrInvalidConfig, field)
		}
		l, err := partition.NewLayout(prefix+topic, n)
		if err != nil {
			return nil, fmt.Errorf("%w: %s[%q]: %w", ErrInvalidConfig, field, topic, err)
		}
		t.layouts[topic] = l
	}
	return t, nil
}

// layout returns topic's layout, of the config or found on the server, or
// nil when it is not known to be partitioned.
func (t *partitionedTopics) layout(topic string) *partition.Layout {
	if t == nil {
		return nil
	}
	if l := t.layouts[topic]; l != nil {
		return l
	}
	if l, ok := t.discovered.Load(topic); ok {
		return l.(*partition.Layout)
	}
	return nil
}

// discover records that the server holds the partition count n for topic,
// whose stream key is key, which the config does not declare: from now on
// the topic is partitioned with that count, and its layout is returned.
func (t *partitionedTopics) discover(topic, key, n string) (*partition.Layout, error) {
	count, err := strconv.Atoi(n)
	if err != nil {
		return nil, fmt.Errorf("%w: topic %q: the server holds %q as its partition count (key %q), not a number: delete that key and declare the count again (valkeystream partitions declare)",
			ErrPartitionCount, topic, n, partition.DeclarationKey(key))
	}
	l, err := partition.NewLayout(key, count)
	if err != nil {
		return nil, fmt.Errorf("%w: topic %q: the partition count %d on the server (key %q): %w",
			ErrPartitionCount, topic, count, partition.DeclarationKey(key), err)
	}
	actual, _ := t.discovered.LoadOrStore(topic, l)
	t.declared.Store(topic, true)
	return actual.(*partition.Layout), nil
}

// declare makes sure the server holds topic's partition count, the same as
// this one: the first Publisher or Subscriber of a topic stores it, and
// one that declares another count gets an error naming both.
func (t *partitionedTopics) declare(ctx context.Context, client redis.Scripter, topic string) error {
	if _, ok := t.declared.Load(topic); ok {
		return nil
	}
	if err := declarePartitions(ctx, client, topic, t.layout(topic)); err != nil {
		return err
	}
	t.declared.Store(topic, true)
	return nil
}

// knownPlain reports whether the server said topic is not partitioned.
func (t *partitionedTopics) knownPlain(topic string) bool {
	_, ok := t.plain.Load(topic)
	return ok
}

// resolve asks the server, once per topic, whether topic, whose stream key
// is key and which the config does not declare partitioned, is: it returns
// the layout of the count the server holds (see discover), or nil for a
// plain topic.
func (t *partitionedTopics) resolve(ctx context.Context, client redis.UniversalClient, topic, key string) (*partition.Layout, error) {
	if t.knownPlain(topic) {
		return nil, nil
	}
	if l := t.layout(topic); l != nil {
		return l, nil
	}
	n, declared, err := declaredCount(ctx, client, key)
	switch {
	case err != nil:
		return nil, fmt.Errorf("valkeystream: checking whether topic %q is partitioned (%q): %w", topic, partition.DeclarationKey(key), err)
	case declared:
		return t.discover(topic, key, n)
	}
	t.plain.Store(topic, true)
	return nil, nil
}

// declaredCount returns the partition count the server holds for the
// stream key key, if it holds one. Without permission on the key (an ACL
// written before partitions) the topic is taken for a plain one, unchecked.
func declaredCount(ctx context.Context, client redis.UniversalClient, key string) (n string, declared bool, err error) {
	n, err = client.Get(ctx, partition.DeclarationKey(key)).Result()
	switch {
	case errors.Is(err, redis.Nil) || noPermission(err):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return n, true, nil
}

// noPermission reports whether err is the server's refusal of a user's
// call (an ACL).
func noPermission(err error) bool { return redis.HasErrorPrefix(err, "NOPERM") }

// fanOutPartitionedError is the error of a fan-out subscription (no
// ConsumerGroup) of topic, whose stream key is key, which the server holds
// partitioned with n partitions.
func fanOutPartitionedError(topic, key, n string) error {
	return fmt.Errorf("%w: topic %q is declared with %s partitions on the server (key %q): a partitioned topic is read by consumer groups only; set ConsumerGroup",
		ErrPartitionCount, topic, n, partition.DeclarationKey(key))
}

// partitionOf returns the partition of msg on topic: of its key, or of its
// UUID for a message without one.
func (p *Publisher) partitionOf(topic string, l *partition.Layout, msg *message.Message) int {
	var key string
	if p.config.PartitionKey != nil {
		key = p.config.PartitionKey(topic, msg)
	} else {
		key = msg.Metadata.Get(MetadataPartitionKey)
	}
	if key == "" {
		// No key: by the UUID, which spreads evenly and sends a message
		// published again to the same partition (so that
		// IdempotentWindow and a Deduplicator catch the copy).
		key = msg.UUID
	}
	return partition.Of(key, l.N())
}

// publishPartitioned writes msgs to the partitions of topic, each
// partition's messages in one call, in their order. The caller holds mu.
func (p *Publisher) publishPartitioned(topic string, l *partition.Layout, msgs []*message.Message) error {
	ctx, cancel := publishContext(msgs)
	err := p.partitions.declare(ctx, p.config.Client, topic)
	cancel()
	if err != nil {
		return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
	}
	if len(msgs) == 1 {
		return p.publishTo(topic, l.Stream(p.partitionOf(topic, l, msgs[0])), msgs)
	}
	byPartition := make(map[int][]*message.Message)
	var order []int
	for _, m := range msgs {
		i := p.partitionOf(topic, l, m)
		if _, ok := byPartition[i]; !ok {
			order = append(order, i)
		}
		byPartition[i] = append(byPartition[i], m)
	}
	var all *PublishError
	for _, i := range order {
		err := p.publishTo(topic, l.Stream(i), byPartition[i])
		if err == nil {
			continue
		}
		var perr *PublishError
		if !errors.As(err, &perr) {
			perr = &PublishError{Topic: topic, NotSent: uuids(byPartition[i]), Err: err}
		}
		if all == nil {
			all = &PublishError{Topic: topic, Total: len(msgs), Err: perr.Err}
		}
		all.NotSent = append(all.NotSent, perr.NotSent...)
		all.MaybeWritten = append(all.MaybeWritten, perr.MaybeWritten...)
	}
	if all != nil {
		return all
	}
	return nil
}

// streamKeyOf returns the stream key msg of topic is written to: its
// partition's on a partitioned topic.
func (p *Publisher) streamKeyOf(ctx context.Context, topic string, msg *message.Message) (string, error) {
	l := p.partitions.layout(topic)
	if l == nil {
		key := p.config.KeyPrefix + topic
		var err error
		if l, err = p.partitions.resolve(ctx, p.config.Client, topic, key); l == nil || err != nil {
			return key, err
		}
	}
	if err := p.partitions.declare(ctx, p.config.Client, topic); err != nil {
		return "", err
	}
	return l.Stream(p.partitionOf(topic, l, msg)), nil
}
