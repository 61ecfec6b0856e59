package valkeystream

import "sync/atomic"

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

var deadLetterCounts struct {
	published, publishFailures, marked atomic.Int64
}

// DeadLetterCounts returns the counters of the dead-letter middlewares of
// this process.
func DeadLetterCounts() DeadLetterStats {
	return DeadLetterStats{
		Published:       deadLetterCounts.published.Load(),
		PublishFailures: deadLetterCounts.publishFailures.Load(),
		Marked:          deadLetterCounts.marked.Load(),
	}
}
