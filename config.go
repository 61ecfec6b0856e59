package valkeystream

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// Defaults for the configuration fields. Each field's comment names the one it
// uses.
const (
	// DefaultPartitionOwnerTTL is how long a subscription's ownership of a
	// partition lives without renewal (SubscriberConfig.PartitionOwnerTTL).
	DefaultPartitionOwnerTTL = 10 * time.Second

	// DefaultBatchSize is the most entries one read or claim asks for.
	DefaultBatchSize = 100
	// DefaultBlockTime bounds one blocking read of new entries, and so how
	// long Close waits for a read in progress.
	DefaultBlockTime = 500 * time.Millisecond
	// DefaultClaimInterval is how often a consumer reclaims idle entries of
	// other consumers.
	DefaultClaimInterval = 5 * time.Second
	// DefaultClaimMinIdle is how long an entry must have been idle, by the
	// server's clock, before another consumer may reclaim it.
	DefaultClaimMinIdle = 30 * time.Second
	// DefaultAckFlushInterval bounds how long an Ack waits before it is sent.
	DefaultAckFlushInterval = 100 * time.Millisecond
	// DefaultWaitTimeout bounds how long a Publish with
	// PublisherConfig.WaitReplicas waits for replicas.
	DefaultWaitTimeout = time.Second
	// DefaultDeadLetterSuffix names the dead-letter topic of a topic: the
	// topic plus this suffix. A [Subscriber] copies undecodable entries of a
	// stream to the stream key plus this suffix (see
	// SubscriberConfig.DeadLetterSuffix), and [DeadLetter] publishes failed
	// messages to the original topic plus this suffix unless told otherwise,
	// so both kinds of dead letter of topic "orders" land in "orders.dead".
	DefaultDeadLetterSuffix = ".dead"
	// DefaultNackBackoffMin is, with the default NackResendDelay, the wait
	// before a message Nacked on its second delivery is delivered again (one
	// Nacked on its first comes back at once). The wait doubles with each
	// delivery, as the server counts them, up to NackBackoffMax.
	DefaultNackBackoffMin = 25 * time.Millisecond
	// DefaultNackBackoffMax caps the wait before a Nacked message is
	// delivered again, with the default NackResendDelay: a handler that
	// always fails gets at most 10 deliveries a second. It is short because
	// Watermill expects a Nacked message back soon (its test suite Nacks one
	// message hundreds of times); raise it for a longer backoff, and give up
	// on messages with [DeadLetter].
	DefaultNackBackoffMax = 100 * time.Millisecond
	// DefaultPrefetchWindow is how much of the handler's time one read of
	// new entries asks for (see SubscriberConfig.PrefetchWindow).
	DefaultPrefetchWindow = 10 * time.Millisecond
	// DefaultReadAheadBytes bounds, in bytes, the entries one read of a
	// group subscription takes (see SubscriberConfig.ReadAheadBytes).
	DefaultReadAheadBytes = 4 << 20
	// DefaultCloseGrace is how long a closing subscription waits for the
	// message in a handler's hands to be Acked or Nacked.
	DefaultCloseGrace = 5 * time.Second
	// DefaultConsumerLeaseTTL is how long a consumer name stays leased to a
	// subscription that stopped renewing it (a process that died without
	// Close): the longest its pending entries wait to be taken over by a
	// subscription of the same base name.
	DefaultConsumerLeaseTTL = 10 * time.Second
	// DefaultRemoveIdleConsumersFactor times ClaimMinIdle is the default
	// RemoveIdleConsumersAfter.
	DefaultRemoveIdleConsumersFactor = 4
)

// Sentinels for the fields where zero means the default and "off" or "at
// once" needs a value of its own.
const (
	// AckAtOnce, as SubscriberConfig.AckFlushInterval, sends each Ack as
	// soon as the handler makes it, before the next message is delivered.
	AckAtOnce time.Duration = -1
	// NackAtOnce, as SubscriberConfig.NackResendDelay, delivers a Nacked
	// message again without waiting.
	NackAtOnce time.Duration = -1
	// NoReclaim, as SubscriberConfig.ClaimInterval, turns the claim beat
	// off: the subscription never reclaims entries of other consumers.
	NoReclaim time.Duration = -1
	// FullBatches, as SubscriberConfig.PrefetchWindow, makes every read of
	// new entries ask for BatchSize, however slow the handler (within
	// SubscriberConfig.ReadAheadBytes).
	FullBatches time.Duration = -1
	// NoCloseGrace, as SubscriberConfig.CloseGrace, ends a subscription
	// without waiting for the message in a handler's hands.
	NoCloseGrace time.Duration = -1
	// AlwaysPollDelayed, as SubscriberConfig.DelayedIdlePollInterval, makes
	// the Subscriber look for delayed messages every DelayedPollInterval
	// even while none of its topics has any.
	AlwaysPollDelayed time.Duration = -1
	// NoDeadLetter, as SubscriberConfig.DeadLetterSuffix, turns the
	// dead-lettering of undecodable entries off: such an entry is logged at
	// Error level with its raw fields, counted and acknowledged.
	NoDeadLetter = "-"
)

// NoReadAheadLimit, as SubscriberConfig.ReadAheadBytes, bounds reads only
// in entries (BatchSize and PrefetchWindow), whatever their size.
const NoReadAheadLimit int64 = -1

// NeverRemoveConsumers, as SubscriberConfig.RemoveIdleConsumersAfter, keeps
// every consumer in the group: none is ever removed.
const NeverRemoveConsumers time.Duration = -1

// minConsumerLeaseTTL is the shortest ConsumerLeaseTTL: the lease is renewed
// every fifth of it, and a renewal needs a round trip.
const minConsumerLeaseTTL = 100 * time.Millisecond

// StartPosition is where a new consumer group begins reading. It has no usable
// zero value: a [Subscriber] must declare one.
type StartPosition int

const (
	// StartNew begins a new group at the stream's end ("$"): it receives only
	// entries added after the group was created.
	StartNew StartPosition = iota + 1
	// StartHead begins a new group at the stream's head ("0"): it receives
	// every entry already in the stream, then new ones.
	StartHead
)

// String returns "new" or "head".
func (p StartPosition) String() string {
	switch p {
	case StartNew:
		return "new"
	case StartHead:
		return "head"
	default:
		return fmt.Sprintf("StartPosition(%d)", int(p))
	}
}

// id is the id XGROUP CREATE takes for the position.
func (p StartPosition) id() string {
	if p == StartHead {
		return "0"
	}
	return "$"
}

// MarshalText implements encoding.TextMarshaler: "new" or "head". The zero
// value, which is not a position, is an error.
func (p StartPosition) MarshalText() ([]byte, error) {
	if p != StartNew && p != StartHead {
		return nil, fmt.Errorf("%w: start position %s cannot be written: use StartNew or StartHead", ErrInvalidConfig, describeStart(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, reading what
// [ParseStartPosition] reads, so that a start position can be set from a
// configuration file or a flag.
func (p *StartPosition) UnmarshalText(text []byte) error {
	v, err := ParseStartPosition(string(text))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// ParseStartPosition reads a start position from text, as found in a
// configuration file or an environment variable: "new" or "$" is [StartNew],
// "head" or "0" is [StartHead].
func ParseStartPosition(s string) (StartPosition, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "new", "$":
		return StartNew, nil
	case "head", "0":
		return StartHead, nil
	default:
		return 0, fmt.Errorf("%w: start position %q is unknown: use %q ($, only new entries) or %q (0, replay the stream from its head)",
			ErrInvalidConfig, s, "new", "head")
	}
}

// SubscriberConfig configures a [Subscriber]. [NewSubscriber] takes a copy, so
// later changes by the caller have no effect.
type SubscriberConfig struct {
	// Client is the connection to the server: a *redis.Client,
	// *redis.ClusterClient, a Sentinel failover client or a ring. Required.
	// A consumer-group subscription sends its blocking reads of new entries
	// through a client of its own, made from this client's options (one
	// connection), so that Close ends a blocked read at once; the hooks
	// added to this client (AddHook) do not see those reads. With a client
	// of another type (a ring) the blocking reads use this client, and each
	// running subscription holds one of its connections while it blocks, so
	// its PoolSize must exceed the number of subscriptions running at once;
	// a fan-out subscription always does (on a *redis.Client, a Subscriber
	// whose fan-out subscriptions come to hold the whole pool logs it once,
	// at Error).
	Client redis.UniversalClient

	// ConsumerGroup is the consumer group the subscriptions read through.
	// Each entry goes to exactly one consumer of the group and stays pending
	// until it is Acked. Empty means fan-out: every subscription reads every
	// entry with XREAD, nothing is acknowledged and nothing is pending.
	ConsumerGroup string

	// Consumer is this consumer's name in the group, or rather the base of
	// it. A consumer restarted under the same name after Close gets its own
	// pending entries back before anything new; one restarted after a crash
	// gets them as soon as its predecessor's lease lapses. Default: the host
	// name, which is stable across restarts of a process on the same host.
	//
	// A name belongs to one live subscription at a time, in any process:
	// Subscribe takes a lease on it on the server (see ConsumerLeaseTTL),
	// and takes the first of name, name-2, name-3, ... whose lease is free.
	// It never waits: a name leased by a live subscription, here or in
	// another process, or by one that stopped without Close (a killed
	// process) is skipped, so a restarted process handles new messages at
	// once. A subscription takes over the pending entries of another name
	// of its base as soon as that name's lease lapses without a renewal
	// (its holder died), and leaves those of a live holder alone. This
	// holds for a name set here as for the default. The name a
	// subscription got is in every message's MetadataConsumer. Only used
	// with ConsumerGroup.
	Consumer string

	// ConsumerLeaseTTL is how long the lease on a consumer name lasts
	// unless renewed. A subscription renews its lease every fifth of it and
	// deletes it on Close, so it only matters when a process dies: the
	// pending entries of a killed process wait up to this long before a
	// subscription of the same base name takes them over (its new messages
	// do not wait), and a subscription whose renewals could not reach the
	// server for this long may lose its name to another subscription (it
	// then stops, see docs/design.md). At least 100ms. Only used with
	// ConsumerGroup. Default: DefaultConsumerLeaseTTL.
	ConsumerLeaseTTL time.Duration

	// RemoveIdleConsumersAfter is how long a consumer of the group must have
	// been idle, as the server measures it (XINFO CONSUMERS idle), before a
	// subscription of the group removes it (XGROUP DELCONSUMER) on its claim
	// beat, so that the names of consumers that left do not accumulate. A
	// consumer is only removed while it holds no pending entries and while
	// no subscription holds a lease on its name. It must exceed
	// ClaimMinIdle; NeverRemoveConsumers switches removal off. Only used
	// with ConsumerGroup, not by partitioned topics (checked like
	// ClaimMinIdle). Default: DefaultRemoveIdleConsumersFactor ×
	// ClaimMinIdle (2 minutes with the default ClaimMinIdle).
	RemoveIdleConsumersAfter time.Duration

	// Start is where a new consumer group begins: StartNew ($, only entries
	// added after the group exists) or StartHead (0, the whole stream).
	// Required, with no default. An existing group keeps its position. A
	// fan-out subscription (no ConsumerGroup) begins at the same place.
	Start StartPosition

	// KeyPrefix is prepended to every topic to form the stream key. It must
	// not contain '{' or '}', so that a topic's hash tag still decides its
	// cluster slot. Default: none.
	KeyPrefix string

	// Partitions declares partitioned topics: topic -> partition count
	// (1..MaxPartitions), as PublisherConfig.Partitions does, checked
	// against the count on the server. A topic not in it is partitioned
	// all the same when the server holds its count (declared by the
	// valkeystream command or by another side's config): the Subscriber
	// finds it in the round trip that starts a plain topic's subscription.
	// Within the consumer group each partition is handled by one
	// live subscription at a time, in stream order with one message in
	// flight, so a subscription's messages of one partition key come one
	// after the other, in order; a subscription handles the partitions it
	// owns in parallel, and the subscriptions of the group split the
	// partitions evenly among them (docs/partitions.md). Needs
	// ConsumerGroup. Default: none.
	Partitions map[string]int

	// PartitionOwnerTTL is how long a subscription's ownership of a
	// partition lives without renewal: a subscription that dies (kill -9,
	// cut off) keeps its partitions this long before the others take them
	// over. It is renewed, and the partitions rebalanced, every twentieth
	// of it; a subscription that Closes releases its partitions (after its
	// in-flight messages), and the others take them at their next beat.
	// At least 100ms. Only used by partitioned topics. Default:
	// DefaultPartitionOwnerTTL.
	PartitionOwnerTTL time.Duration

	// BatchSize is the most entries one read (XREADGROUP or XREAD COUNT) or
	// one claim (XAUTOCLAIM COUNT) takes. A subscription never holds more
	// fetched but undelivered entries than this. Default: DefaultBatchSize.
	BatchSize int64

	// PrefetchWindow sizes the reads of new entries by how fast the handler
	// settles messages (from hand-over to Ack or Nack, averaged over the
	// last few): a read asks for about as many entries as the handler
	// settles in this time, at least 1 and at most BatchSize, and 1 before
	// it has settled any. So a fast handler reads whole batches, while a
	// slow one (10 ms or more a message, with the default) reads one entry
	// at a time and leaves a backlog to its peers, and a crash strands
	// little. FullBatches (-1) always asks for BatchSize. Drains and claims
	// always ask for BatchSize. ReadAheadBytes bounds all of these reads
	// in bytes as well. Only used with ConsumerGroup. Default:
	// DefaultPrefetchWindow.
	PrefetchWindow time.Duration

	// ReadAheadBytes bounds, in bytes, how much one read takes: the
	// subscription estimates an entry's size from the entries it has read
	// (a moving average of the summed lengths of their field names and
	// values) and asks for at most as many entries as fit in this bound, at
	// least 1, and 1 before it has seen any. So with large payloads a
	// subscription holds about this much read ahead instead of BatchSize
	// payloads, like Kafka's fetch.max.bytes; a payload larger than the
	// bound is still read, one at a time. It applies to reads of new
	// entries (after PrefetchWindow), to drains of the consumer's own
	// pending entries and to claims, which hold payloads just the same. The
	// estimate is an average: entries of mixed sizes can pass the bound.
	// NoReadAheadLimit (-1) bounds reads in entries only. Only used with
	// ConsumerGroup. Default: DefaultReadAheadBytes (4 MiB).
	ReadAheadBytes int64

	// BlockTime bounds one blocking read of new entries (BLOCK). A group
	// subscription on a *redis.Client or *redis.ClusterClient ends a blocked
	// read at once when it ends; otherwise Close and a cancelled Subscribe
	// context wait up to about this long for a read in progress (see
	// docs/design.md, "Close"). It cannot be infinite, and
	// it is at least 1ms; the server counts it in whole milliseconds, so it
	// is rounded down to one. Default: DefaultBlockTime.
	BlockTime time.Duration

	// ClaimInterval is the beat on which the subscription reclaims entries
	// other consumers left idle for ClaimMinIdle (XAUTOCLAIM). On Redis 8.4
	// and later every read of new entries reclaims too (XREADGROUP ...
	// CLAIM, see docs/server-verbs.md). It is at least 1ms, or
	// NoReclaim (-1) to never reclaim, on the beat or in reads: then entries of a consumer that is
	// gone for good stay pending until a consumer of that name returns.
	// Only used with ConsumerGroup. Default: DefaultClaimInterval.
	ClaimInterval time.Duration

	// ClaimMinIdle is how long an entry must have been idle, as the server
	// measures it, before another consumer reclaims it (XAUTOCLAIM
	// min-idle-time). A subscription keeps its hold on the entries it holds
	// every ClaimMinIdle/3, so only entries of a consumer that died or
	// stalled for this long are reclaimed. It must exceed BlockTime and
	// AckFlushInterval. The server counts it in whole milliseconds, so it is
	// rounded down to one. Only used with ConsumerGroup, and not by
	// partitioned topics, which never claim: with Partitions set, its rules
	// are checked at the Subscribe of a plain topic rather than by
	// NewSubscriber. Default: DefaultClaimMinIdle.
	ClaimMinIdle time.Duration

	// NackResendDelay is how long a Nacked message waits before it is
	// delivered again: a positive value is a fixed wait, NackAtOnce (-1)
	// does not wait. Acks and hold renewals go on meanwhile. Default (0): a
	// backoff that grows with the delivery count, so that a handler that
	// always fails does not spin: no wait after the first delivery (a
	// passing failure costs nothing), DefaultNackBackoffMin after the second,
	// doubling with each one (50 ms after the third, 100 ms after the
	// fourth), up to NackBackoffMax. To give up on a message, use
	// [DeadLetter].
	NackResendDelay time.Duration

	// NackBackoffMax caps the growing wait of the default NackResendDelay;
	// it is not used with a fixed one. Default: DefaultNackBackoffMax.
	NackBackoffMax time.Duration

	// AckFlushInterval bounds how long an Ack may wait to be sent together
	// with later ones, or AckAtOnce (-1) to send each Ack on its own as soon
	// as it is made (one round trip per message). Acks are always sent
	// before the next read and on Close. Only used with ConsumerGroup.
	// Default: DefaultAckFlushInterval.
	AckFlushInterval time.Duration

	// DeadLetterSuffix names the stream that receives entries that cannot
	// be decoded: the stream key plus this suffix. Such an entry is copied
	// there as a dead letter, a message that DefaultMarshaler decodes, with
	// its raw fields as metadata, the error and where it came from (see
	// docs/dead-letters.md), then acknowledged. [DeadLetter] publishes to
	// the same stream when its DeadLetterConfig.Suffix is the same (through a
	// Publisher with the same KeyPrefix). NoDeadLetter ("-") turns this off.
	// Only used with ConsumerGroup. Default: DefaultDeadLetterSuffix.
	DeadLetterSuffix string

	// Unmarshaler decodes entries into messages. Default: DefaultMarshaler.
	Unmarshaler Unmarshaler

	// DelayedPollInterval is how often the Subscriber moves the due delayed
	// messages of every topic it subscribes to into their streams, in one
	// pipeline (see docs/delay.md), once the Subscriber has found delayed
	// messages of one of its topics (before that, see
	// DelayedIdlePollInterval): a delayed message is delivered within
	// about this long after it is due. A negative value turns moving off for this
	// Subscriber; some other subscription of the topic must then run it.
	// Otherwise at least 1ms. Default: DefaultDelayedPollInterval.
	DelayedPollInterval time.Duration
	// DelayedIdlePollInterval is how often the Subscriber looks for
	// delayed messages (one EXISTS per 200 topics) until it finds some for
	// one of its topics: from then on it looks every DelayedPollInterval.
	// A Publisher of this process that stores a delayed message makes the
	// Subscribers of the process look at once; one of another process is
	// seen within DelayedIdlePollInterval, so the first delayed message a
	// Subscriber sees, stored by another process with a delay shorter than
	// DelayedIdlePollInterval, may be moved up to DelayedIdlePollInterval
	// minus its delay late
	// (see docs/delay.md). AlwaysPollDelayed (-1) looks every
	// DelayedPollInterval always. Otherwise at least DelayedPollInterval.
	// Default: DefaultDelayedIdlePollInterval, or DelayedPollInterval if
	// that is longer.
	DelayedIdlePollInterval time.Duration
	// CloseGrace is how long a subscription that ends (Close, or its
	// Subscribe context cancelled) waits for the message in a handler's
	// hands to be Acked or Nacked. Its context stays alive meanwhile, and an
	// Ack made within CloseGrace is sent, so a handler that finishes in time
	// causes no redelivery. The entries read ahead and never handed to a
	// handler (and one Nacked meanwhile) are handed back: marked idle, so
	// that a peer reclaims them on its next claim beat rather than after
	// ClaimMinIdle; their delivery counts do not grow. NoCloseGrace (-1)
	// does not wait. Only used with ConsumerGroup. Default:
	// DefaultCloseGrace.
	CloseGrace time.Duration

	// CloseClient makes Close close Client too. Default: false, the client
	// stays open for its owner.
	CloseClient bool

	// DeleteAcked makes the subscriptions delete each entry from its stream
	// once every consumer group of the stream has acknowledged it (XACKDEL
	// ... ACKED instead of XACK), so that a work-queue topic does not grow
	// without a Retention policy. An entry a group has not read yet, or
	// holds pending, stays. It needs XACKDEL (Redis 8.2 or later, Valkey
	// 9.2): Subscribe fails on a server without it. Only with
	// ConsumerGroup. Default: false, entries stay until trimmed.
	DeleteAcked bool

	// BaselineVerbs makes the Subscriber use only the stream verbs every
	// supported server has (Redis 6.2's), even where the server has newer
	// ones (see docs/server-verbs.md): reclaiming with XAUTOCLAIM on the
	// claim beat instead of inside reads (Redis 8.4). Behaviour is the same
	// on both paths; DeleteAcked needs the newer path. Default: false, each
	// verb is used where the server has it.
	BaselineVerbs bool
}

func (c *SubscriberConfig) setDefaults() {
	if c.ConsumerGroup != "" && c.Consumer == "" {
		if host, err := os.Hostname(); err == nil {
			c.Consumer = host
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BlockTime == 0 {
		c.BlockTime = DefaultBlockTime
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = DefaultClaimInterval
	}
	if c.ClaimMinIdle == 0 {
		c.ClaimMinIdle = DefaultClaimMinIdle
	}
	if c.NackBackoffMax == 0 {
		c.NackBackoffMax = DefaultNackBackoffMax
	}
	if c.AckFlushInterval == 0 {
		c.AckFlushInterval = DefaultAckFlushInterval
	}
	if c.ConsumerLeaseTTL == 0 {
		c.ConsumerLeaseTTL = DefaultConsumerLeaseTTL
	}
	if c.RemoveIdleConsumersAfter == 0 {
		c.RemoveIdleConsumersAfter = DefaultRemoveIdleConsumersFactor * c.ClaimMinIdle
	}
	if c.PrefetchWindow == 0 {
		c.PrefetchWindow = DefaultPrefetchWindow
	}
	if c.CloseGrace == 0 {
		c.CloseGrace = DefaultCloseGrace
	}
	if c.ReadAheadBytes == 0 {
		c.ReadAheadBytes = DefaultReadAheadBytes
	}
	if c.DeadLetterSuffix == "" {
		c.DeadLetterSuffix = DefaultDeadLetterSuffix
	}
	if c.Unmarshaler == nil {
		c.Unmarshaler = DefaultMarshaler{}
	}
	if c.DelayedPollInterval == 0 {
		c.DelayedPollInterval = DefaultDelayedPollInterval
	}
	if c.DelayedIdlePollInterval == 0 {
		c.DelayedIdlePollInterval = max(DefaultDelayedIdlePollInterval, c.DelayedPollInterval)
	}
	if c.PartitionOwnerTTL == 0 {
		c.PartitionOwnerTTL = DefaultPartitionOwnerTTL
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps [ErrInvalidConfig] and names the field. Zero values that have a
// default are valid. Validate does not change c.
func (c SubscriberConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: Client is required: pass a go-redis v9 client", ErrInvalidConfig)
	case c.Start != StartNew && c.Start != StartHead:
		return fmt.Errorf("%w: Start is %s: declare StartNew ($, only entries added after the group exists) or StartHead (0, replay the stream from its head)",
			ErrInvalidConfig, describeStart(c.Start))
	case c.DeleteAcked && c.ConsumerGroup == "":
		return fmt.Errorf("%w: DeleteAcked is set without a ConsumerGroup: only a group acknowledges entries; set ConsumerGroup or unset DeleteAcked", ErrInvalidConfig)
	case c.DeleteAcked && c.BaselineVerbs:
		return fmt.Errorf("%w: DeleteAcked needs XACKDEL, which BaselineVerbs rules out: unset one of them", ErrInvalidConfig)
	case len(c.Partitions) > 0 && c.DeleteAcked:
		return fmt.Errorf("%w: DeleteAcked is set with Partitions: a partition's Acks are checked against its ownership and sent as XACK; unset one of them", ErrInvalidConfig)
	case len(c.Partitions) > 0 && c.ConsumerGroup == "":
		return fmt.Errorf("%w: Partitions is set without a ConsumerGroup: a partition is owned by one subscription of a group; set ConsumerGroup", ErrInvalidConfig)
	case c.PartitionOwnerTTL != 0 && c.PartitionOwnerTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: PartitionOwnerTTL is %s: it must be at least 100ms (0: %s)", ErrInvalidConfig, c.PartitionOwnerTTL, DefaultPartitionOwnerTTL)
	case c.ConsumerGroup != "" && c.Consumer == "":
		return fmt.Errorf("%w: Consumer is empty and the host name is unknown: set Consumer", ErrInvalidConfig)
	case strings.ContainsAny(c.KeyPrefix, "{}"):
		return fmt.Errorf("%w: KeyPrefix %q contains '{' or '}': a prefix must not change the cluster hash slot of a topic", ErrInvalidConfig, c.KeyPrefix)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: BatchSize is %d: it must be positive", ErrInvalidConfig, c.BatchSize)
	case c.BlockTime < time.Millisecond:
		return fmt.Errorf("%w: BlockTime is %s: it must be at least 1ms (the server counts in milliseconds, and an infinite block could never be interrupted)", ErrInvalidConfig, c.BlockTime)
	case c.ClaimInterval < time.Millisecond && c.ClaimInterval != NoReclaim:
		return fmt.Errorf("%w: ClaimInterval is %s: it must be at least 1ms (a shorter beat would claim again before ever reading new entries), or NoReclaim (-1)", ErrInvalidConfig, c.ClaimInterval)
	case c.NackResendDelay < 0 && c.NackResendDelay != NackAtOnce:
		return fmt.Errorf("%w: NackResendDelay is %s: it must be positive, 0 (the default) or NackAtOnce (-1)", ErrInvalidConfig, c.NackResendDelay)
	case c.PrefetchWindow < 0 && c.PrefetchWindow != FullBatches:
		return fmt.Errorf("%w: PrefetchWindow is %s: it must be positive, 0 (the default) or FullBatches (-1)", ErrInvalidConfig, c.PrefetchWindow)
	case c.ReadAheadBytes < 0 && c.ReadAheadBytes != NoReadAheadLimit:
		return fmt.Errorf("%w: ReadAheadBytes is %d: it must be positive, 0 (the default) or NoReadAheadLimit (-1)", ErrInvalidConfig, c.ReadAheadBytes)
	case c.CloseGrace < 0 && c.CloseGrace != NoCloseGrace:
		return fmt.Errorf("%w: CloseGrace is %s: it must be positive, 0 (the default) or NoCloseGrace (-1)", ErrInvalidConfig, c.CloseGrace)
	case c.NackBackoffMax < 0:
		return fmt.Errorf("%w: NackBackoffMax is %s: it must be positive, or 0 (the default)", ErrInvalidConfig, c.NackBackoffMax)
	case c.AckFlushInterval < 0 && c.AckFlushInterval != AckAtOnce:
		return fmt.Errorf("%w: AckFlushInterval is %s: it must be positive, 0 (the default) or AckAtOnce (-1)", ErrInvalidConfig, c.AckFlushInterval)
	case c.DelayedPollInterval >= 0 && c.DelayedPollInterval < time.Millisecond:
		return fmt.Errorf("%w: DelayedPollInterval is %s: it must be at least 1ms, or negative to turn moving delayed messages off", ErrInvalidConfig, c.DelayedPollInterval)
	case c.DelayedIdlePollInterval != AlwaysPollDelayed && c.DelayedPollInterval > 0 && c.DelayedIdlePollInterval < c.DelayedPollInterval:
		return fmt.Errorf("%w: DelayedIdlePollInterval is %s: it must be at least DelayedPollInterval (%s), or AlwaysPollDelayed (-1) to look every DelayedPollInterval always",
			ErrInvalidConfig, c.DelayedIdlePollInterval, c.DelayedPollInterval)
	case c.ConsumerLeaseTTL < minConsumerLeaseTTL:
		return fmt.Errorf("%w: ConsumerLeaseTTL is %s: it must be at least %s (the lease is renewed every fifth of it)",
			ErrInvalidConfig, c.ConsumerLeaseTTL, minConsumerLeaseTTL)
	}
	if _, err := newPartitionedTopics(c.Partitions, c.KeyPrefix, "Partitions"); err != nil {
		return err
	}
	if len(c.Partitions) == 0 {
		return c.validateClaims()
	}
	return nil
}

// validateClaims checks the fields only subscriptions of plain topics use
// (ClaimMinIdle, RemoveIdleConsumersAfter): partitioned topics never claim
// (a partition's entries are handed over to its next owner) nor remove
// consumers. Validate checks them when the config declares no Partitions;
// with Partitions they are checked at the Subscribe of a plain topic, so
// that a Subscriber of partitioned topics alone is not refused for them.
func (c SubscriberConfig) validateClaims() error {
	switch {
	case c.ClaimMinIdle <= c.BlockTime || c.ClaimMinIdle <= c.AckFlushInterval:
		return fmt.Errorf("%w: ClaimMinIdle (%s) must exceed BlockTime (%s) and AckFlushInterval (%s), or live entries would look abandoned",
			ErrInvalidConfig, c.ClaimMinIdle, c.BlockTime, c.AckFlushInterval)
	case c.RemoveIdleConsumersAfter != NeverRemoveConsumers && c.RemoveIdleConsumersAfter <= c.ClaimMinIdle:
		return fmt.Errorf("%w: RemoveIdleConsumersAfter (%s) must exceed ClaimMinIdle (%s), or be NeverRemoveConsumers to keep every consumer",
			ErrInvalidConfig, c.RemoveIdleConsumersAfter, c.ClaimMinIdle)
	}
	return nil
}

func describeStart(p StartPosition) string {
	if p == 0 {
		return "not set"
	}
	return p.String()
}

// PublisherConfig configures a [Publisher]. [NewPublisher] takes a copy, so
// later changes by the caller have no effect.
type PublisherConfig struct {
	// Client is the connection to the server. Required.
	Client redis.UniversalClient

	// KeyPrefix is prepended to every topic to form the stream key. It must
	// not contain '{' or '}'. Default: none.
	KeyPrefix string

	// Marshaler encodes messages into entries. Default: DefaultMarshaler.
	Marshaler Marshaler

	// Retention trims a topic's stream as entries are added, by topic (the
	// name passed to Publish, without KeyPrefix). Default: no trimming.
	//
	// Where the server trims with XADD ... ACKED (Redis 8.2.7, 8.4.4, 8.6
	// and later; see docs/server-verbs.md), trimming keeps every entry that
	// some consumer group of the stream has not acknowledged, including
	// those a group has not read yet, unless Retention.DropUnacknowledged is
	// set: the stream then grows past the limit while a group lags. On
	// other servers, with DropUnacknowledged, or with BaselineVerbs,
	// trimming removes entries whether or not a consumer group has handled
	// them: an entry trimmed while it is still pending is lost to its group
	// (the Subscriber acknowledges it and counts it in Stats.MissingBodies),
	// and one trimmed before any group read it is never delivered; the
	// Publisher logs that once per topic (unless DropUnacknowledged says it
	// is meant). Keep retention well above the longest backlog you expect.
	Retention map[string]Retention

	// IdempotentWindow makes publishing idempotent: a message published
	// again with the same UUID within this time of the first is stored once
	// (the Publish of the copy succeeds and adds nothing). It must be
	// between 1s and MaxIdempotentWindow (24h); the server counts it in
	// whole seconds, rounded up. Default: 0, off.
	//
	// With it, the client may send an XADD again after a connection error
	// within one Publish, and messages listed in PublishError.MaybeWritten
	// (or not confirmed by replicas, ErrNotReplicated) are safe to publish
	// again within the window. The messages of a Publish call that carries
	// a delayed message are not deduplicated (see docs/delay.md), nor is a
	// message with an empty UUID (which DefaultMarshaler refuses).
	//
	// On Redis 8.6 and later the server deduplicates (XADD ... IDMP): the
	// Publisher sets the stream's IDMP-DURATION to the window and
	// IDMP-MAXSIZE to 10000 before its first XADD to the stream, and
	// spreads UUIDs over 16 producer ids ("valkeystream-0" to
	// "valkeystream-f", by the FNV-1a hash of the UUID), so a copy is
	// caught while its UUID is among the last 10000 of its producer id
	// (about 160000 messages of the stream) and within the window. Every
	// Publisher of a stream must use the same window: setting another one
	// makes the server forget the UUIDs it remembers. On older servers, or
	// with BaselineVerbs, a script stores each message with a mark key
	// beside the stream ("{<stream>}:idmp:<uuid>", or "<stream>.idmp:<uuid>"
	// when the stream key has a hash tag) that expires after the window:
	// one key per message published within the window, and a topic that
	// contains '}' without a hash tag cannot be published there. The two
	// paths do not see each other's marks: a copy published after the
	// client moved to a server of another version (a failover, an upgrade)
	// is not caught.
	IdempotentWindow time.Duration

	// WaitReplicas makes Publish wait until this many replicas have
	// acknowledged the call's entries (not with a redis.Ring client): WAIT follows the XADDs in the same
	// round trip, on the same connection (on a cluster, to the master of the
	// topic's slot; calls that share a round trip share the WAIT). When fewer
	// replicas acknowledge within WaitTimeout, Publish returns a
	// *PublishError wrapping [ErrNotReplicated]: the entries were written on
	// the master and may still be there (or reach the replicas later), so
	// publishing them again may store duplicates, never lose them. With
	// WaitReplicas at most the number of replicas, a Publish that returned
	// nil survives a failover to any of the replicas that acknowledged. A
	// master that has been replaced without knowing it has no replicas left,
	// so its writes fail instead of being lost. Default: 0, no waiting
	// (replication is asynchronous: a failover can lose the last entries a
	// master acknowledged).
	WaitReplicas int

	// WaitTimeout bounds the wait for replicas (WAIT timeout, in whole
	// milliseconds). It must be below the client's ReadTimeout, which bounds
	// the whole round trip. Only used with WaitReplicas. Default:
	// DefaultWaitTimeout.
	WaitTimeout time.Duration

	// CloseClient makes Close close Client too. Default: false.
	CloseClient bool

	// Partitions declares partitioned topics: topic -> partition count
	// (1..MaxPartitions). A message to such a topic goes to the partition
	// of its key (PartitionKey), each partition being a stream of its own
	// in a cluster hash slot of its own (see docs/partitions.md for the
	// layout). The first Publisher or Subscriber that declares a topic
	// stores its count on the server, and one that declares another count
	// fails (ErrPartitionCount). A topic not in the map whose count the
	// server holds (declared by the valkeystream command or by another
	// side) is found at the first Publish of the topic, in the call a
	// plain topic's first Publish makes anyway, and published partitioned.
	// A partitioned topic's stream key (KeyPrefix plus topic) must not
	// contain '{' or '}'. Default: none: every topic is one stream unless
	// the server holds its partition count.
	Partitions map[string]int

	// PartitionKey returns the partition key of a message to a
	// partitioned topic: messages with one key go to one partition. ""
	// means no key: such a message goes to the partition of its UUID, so
	// unkeyed messages spread evenly and a copy published again goes
	// where the first went. Default:
	// the message's MetadataPartitionKey metadata.
	PartitionKey func(topic string, msg *message.Message) string

	// BaselineVerbs makes the Publisher use only the stream verbs every
	// supported server has (Redis 6.2's), even where the server has newer
	// ones (see docs/server-verbs.md): idempotent publishing by script
	// instead of XADD ... IDMP (Redis 8.6), and Retention trimming without
	// ACKED (Redis 8.2), which may drop unacknowledged entries. Default:
	// false, each verb is used where the server has it. The Publisher
	// finds out which verbs the server has (COMMAND DOCS) only when
	// IdempotentWindow or Retention needs to, and logs the answer at Info;
	// PublisherStats.Verbs shows it.
	BaselineVerbs bool
}

// Retention is how much of a stream a [Publisher] keeps. Trimming is
// approximate ("~"), the cheap form: the server may keep a few more entries
// than asked. At most one of the fields may be set.
type Retention struct {
	// MaxLen keeps about this many newest entries (XADD MAXLEN ~). 0: no limit.
	MaxLen int64
	// MaxAge keeps entries younger than this (XADD MINID ~ with an id made
	// from the publishing host's clock minus MaxAge, so clock skew between
	// host and server shifts it). 0: no limit; an age reaching back before
	// 1970 trims nothing either.
	MaxAge time.Duration
	// DropUnacknowledged makes trimming remove entries whether or not the
	// stream's consumer groups acknowledged them, as on servers without
	// XADD ... ACKED: the stream stays within its limit however far a group
	// lags, and a lagging group loses entries. Default: false, where the
	// server can, trimming keeps entries some group has not acknowledged.
	DropUnacknowledged bool
}

func (c *PublisherConfig) setDefaults() {
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
	if c.WaitReplicas > 0 && c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps [ErrInvalidConfig] and names the field. Validate does not change
// c.
func (c PublisherConfig) Validate() error {
	c.setDefaults()
	if c.Client == nil {
		return fmt.Errorf("%w: Client is required: pass a go-redis v9 client", ErrInvalidConfig)
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return fmt.Errorf("%w: KeyPrefix %q contains '{' or '}': a prefix must not change the cluster hash slot of a topic", ErrInvalidConfig, c.KeyPrefix)
	}
	switch {
	case c.WaitReplicas < 0:
		return fmt.Errorf("%w: WaitReplicas is %d: it must be 0 (no waiting) or the number of replicas to wait for", ErrInvalidConfig, c.WaitReplicas)
	case c.WaitTimeout < 0:
		return fmt.Errorf("%w: WaitTimeout is %s: it must not be negative", ErrInvalidConfig, c.WaitTimeout)
	case c.WaitReplicas > 0 && c.WaitTimeout < time.Millisecond:
		return fmt.Errorf("%w: WaitTimeout is %s: it must be at least 1ms (WAIT counts in milliseconds, and 0 would wait forever)", ErrInvalidConfig, c.WaitTimeout)
	}
	if _, ring := c.Client.(*redis.Ring); ring && c.WaitReplicas > 0 {
		return fmt.Errorf("%w: WaitReplicas is %d with a redis.Ring client: a ring would not send WAIT on the connection of the XADDs; use a single-node, Sentinel or Cluster client", ErrInvalidConfig, c.WaitReplicas)
	}
	if rt, ok := readTimeout(c.Client); ok && c.WaitReplicas > 0 && c.WaitTimeout >= rt {
		return fmt.Errorf("%w: WaitTimeout (%s) must be below the client's ReadTimeout (%s), which bounds the round trip that carries WAIT", ErrInvalidConfig, c.WaitTimeout, rt)
	}
	switch {
	case c.IdempotentWindow < 0:
		return fmt.Errorf("%w: IdempotentWindow is %s: it must be 0 (off) or between 1s and %s", ErrInvalidConfig, c.IdempotentWindow, MaxIdempotentWindow)
	case c.IdempotentWindow > 0 && c.IdempotentWindow < time.Second:
		return fmt.Errorf("%w: IdempotentWindow is %s: it must be at least 1s (the server counts it in whole seconds), or 0 (off)", ErrInvalidConfig, c.IdempotentWindow)
	case c.IdempotentWindow > MaxIdempotentWindow:
		return fmt.Errorf("%w: IdempotentWindow is %s: it must be at most %s (the server's longest IDMP-DURATION)", ErrInvalidConfig, c.IdempotentWindow, MaxIdempotentWindow)
	}
	if _, err := newPartitionedTopics(c.Partitions, c.KeyPrefix, "Partitions"); err != nil {
		return err
	}
	for topic, r := range c.Retention {
		switch {
		case r.MaxLen < 0 || r.MaxAge < 0:
			return fmt.Errorf("%w: Retention[%q] is negative: MaxLen and MaxAge must be 0 (no limit) or positive", ErrInvalidConfig, topic)
		case r.MaxLen > 0 && r.MaxAge > 0:
			return fmt.Errorf("%w: Retention[%q] sets both MaxLen and MaxAge: the server trims by one of them, choose one", ErrInvalidConfig, topic)
		}
	}
	return nil
}

// readTimeout returns the read timeout of a client, when it has one.
func readTimeout(client redis.UniversalClient) (time.Duration, bool) {
	var d time.Duration
	switch c := client.(type) {
	case *redis.Client:
		d = c.Options().ReadTimeout
	case *redis.ClusterClient:
		d = c.Options().ReadTimeout
	}
	return d, d > 0
}
