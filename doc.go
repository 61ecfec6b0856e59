// Package valkeystream is a Watermill Pub/Sub for Valkey and Redis Streams
// with consumer groups.
//
// A Watermill topic is one stream key. A [Subscriber] with a consumer group
// partitions the stream: each entry goes to exactly one consumer of the group,
// and stays in the group's pending entries list (PEL) until the handler Acks
// it. A Subscriber without a consumer group fans out: every subscriber reads
// every entry with XREAD.
//
// # The group door
//
// Every consumer-group subscription starts by running
// XGROUP CREATE <key> <group> <start> MKSTREAM. The BUSYGROUP reply ("the
// group already exists") is success; every other reply is an error from
// Subscribe that names the key, the group and the server's reply. The door
// never deletes a group or a stream.
//
// # The declared start
//
// Where a new group begins is a required choice ([StartNew] or [StartHead])
// with no default: [NewSubscriber] rejects a missing one.
//
// # The loop
//
// One goroutine owns each subscription. It recovers before it reads anything
// new: it drains this consumer's own pending entries from cursor 0, on every
// claim beat it reclaims entries idle longer than
// [SubscriberConfig.ClaimMinIdle] with XAUTOCLAIM, and only then it reads new
// entries with XREADGROUP ... >. While it holds entries it keeps its hold on
// them, so that peers reclaim only the entries of consumers that died.
// Delivery is at-least-once: a reclaimed or drained entry can arrive after
// newer ones, and the message UUID (the id the publisher stored, never the
// stream position) is the key to deduplicate on.
//
// Every delivered message carries the server's delivery count for its entry
// under [MetadataDeliveryCount]; read it with [DeliveryCount].
//
// # Messages that keep failing
//
// The [DeadLetter] middleware copies a message whose handler fails on its
// [DeadLetterConfig.MaxDeliveries]-th delivery to a dead-letter topic, with
// where it came from and why it failed, and only then lets the router Ack it;
// [DeliveryLimit] does the same job through Watermill's PoisonQueue. An entry
// that cannot be decoded is written to the stream key plus
// [SubscriberConfig.DeadLetterSuffix] the same way.
//
// # Duplicates
//
// The [Deduplicator] middleware runs a handler at most once per message UUID
// within a window, keeping the marks in the server, and marks a message done
// only after its handler succeeded, so that a failure is still retried.
// [ExpiringKeyRepository] keeps the keys of Watermill's own Deduplicator in
// the server.
//
// # Publishing
//
// A [Publisher] sends all messages of one Publish call in one round trip, and
// concurrent calls for the same stream share round trips. A message with
// Watermill's delay metadata (components/delay) that is due later waits in a
// sorted set beside the stream ([DelayedKey]) until the running
// subscriptions of its topic move it into the stream.
//
// # Exactly-once outputs and state
//
// The [ExactlyOnce] middleware writes what a handler publishes (or returns)
// and its input's acknowledgement in one script on the server, fenced by the
// entry's consumer and delivery count, so that an input's outputs exist once
// however often its handler runs. The handler's writes to its own keys join
// that step through [StepOf]: applied once per input, all or nothing.
package valkeystream
