package valkeystream

import (
	"sync"
	"sync/atomic"
)

// DeadLetterStats are counters of the [DeadLetter] and [DeliveryLimit]
// middlewares of this process since it started, summed over every one of
// them. Entries a Subscriber dead-letters because they cannot be decoded
// are counted in its own [Stats.InvalidEntries] instead.
type DeadLetterStats struct {
	// Published counts dead letters DeadLetter published, the ones its
	// CrashLimit gave up on included.
	Published int64
	// PublishFailures counts dead letters DeadLetter could not publish:
	// the message was Nacked, to be given up again on its next failing
	// delivery.
	PublishFailures int64
	// Marked counts messages DeliveryLimit marked as given up, for a
	// poison queue added before it to publish.
	Marked int64
}

// DeadLetterSource is where the messages the dead-letter middlewares gave
// up on were delivered from: the stream key and the consumer group a
// Subscriber set in their metadata ([MetadataStream], [MetadataGroup]).
// Group is empty for a fan-out subscription, and both are empty for a
// message that no Subscriber delivered.
type DeadLetterSource struct {
	Stream, Group string
}

// deadLetterCounter is one set of the counters of DeadLetterStats.
type deadLetterCounter struct {
	published, publishFailures, marked atomic.Int64
}

func (c *deadLetterCounter) stats() DeadLetterStats {
	return DeadLetterStats{
		Published:       c.published.Load(),
		PublishFailures: c.publishFailures.Load(),
		Marked:          c.marked.Load(),
	}
}

// deadLetterCounts are the counters of the process, in total and by source.
var deadLetterCounts struct {
	deadLetterCounter

	mu       sync.Mutex // guards bySource
	bySource map[DeadLetterSource]*deadLetterCounter
}

// deadLetterKind picks one counter of a deadLetterCounter.
type deadLetterKind int

const (
	deadLetterPublished deadLetterKind = iota
	deadLetterPublishFailed
	deadLetterMarked
)

func (c *deadLetterCounter) of(kind deadLetterKind) *atomic.Int64 {
	switch kind {
	case deadLetterPublished:
		return &c.published
	case deadLetterPublishFailed:
		return &c.publishFailures
	default:
		return &c.marked
	}
}

// countDeadLetter adds one to the counter kind, in total and for the
// source of the message.
func countDeadLetter(o origin, kind deadLetterKind) {
	deadLetterCounts.of(kind).Add(1)
	source := DeadLetterSource{Stream: o.stream, Group: o.group}
	c := &deadLetterCounts
	c.mu.Lock()
	s := c.bySource[source]
	if s == nil {
		if c.bySource == nil {
			c.bySource = map[DeadLetterSource]*deadLetterCounter{}
		}
		s = &deadLetterCounter{}
		c.bySource[source] = s
	}
	c.mu.Unlock()
	s.of(kind).Add(1)
}

// DeadLetterCounts returns the counters of the dead-letter middlewares of
// this process.
func DeadLetterCounts() DeadLetterStats {
	return deadLetterCounts.stats()
}

// DeadLetterCountsBySource returns the counters of the dead-letter
// middlewares of this process by the stream and group the messages were
// delivered from: the sources they have given up on a message of so far.
// Summed over the sources, they are [DeadLetterCounts].
func DeadLetterCountsBySource() map[DeadLetterSource]DeadLetterStats {
	c := &deadLetterCounts
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[DeadLetterSource]DeadLetterStats, len(c.bySource))
	for source, s := range c.bySource {
		out[source] = s.stats()
	}
	return out
}
