package loop

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Config is what one group subscription reads, with the Subscriber's
// settings already defaulted and validated (see valkeystream's
// SubscriberConfig, where each is documented).
type Config struct {
	Stream, Group, Consumer string

	BatchSize        int64
	PrefetchWindow   time.Duration
	ReadAheadBytes   int64
	BlockTime        time.Duration
	ClaimInterval    time.Duration // negative: never claim
	ClaimMinIdle     time.Duration
	AckFlushInterval time.Duration // negative: every Ack at once
	CloseGrace       time.Duration // negative: do not wait for handlers

	// NackDelay returns how long an entry Nacked on delivery number count
	// waits before it is delivered again.
	NackDelay func(count int64) time.Duration

	// Ordered keeps the stream's order through Nacks (a partition of a
	// partitioned topic): a Nack with a retry-after is a plain Nack,
	// whose entry comes back before the next one.
	Ordered bool
}

// Deps are what a subscription's loop is handed by its Subscriber: the
// server, and what the loop reports to or asks of the rest of the library.
// Only Server, Counters and Logger are required.
type Deps struct {
	Server   Server
	Shared   Waiter // waits for new entries with other subscriptions; nil: Block
	Counters *Counters
	Logger   watermill.LoggerAdapter
	Health   Health

	// Handling turns entries into messages, and settles those no handler
	// does.
	Handling Handling
	// Reopen runs the group door again, after NOGROUP.
	Reopen func(ctx context.Context) error
	// Prune removes departed consumers; the loop calls it when a claim has
	// scanned the pending list to its end.
	Prune func(ctx context.Context)
	// Release releases the consumer name when the loop ends, after its last
	// Acks and before it closes its channel.
	Release func()
	// Inherit tells the loop of pending entries moved to its consumer name
	// from other names; nil: none are.
	Inherit Inheritance
}

// Handling is how a loop turns entries into messages, and settles the
// ones no handler settles.
type Handling struct {
	Decode     DecodeFunc
	DeadLetter DeadLetterFunc
	// GiveUp deals with a message its handler gave up on; nil: such a
	// Nack is a plain one.
	GiveUp GiveUpFunc
	// Delivered is told of each hand-over to a handler.
	Delivered func(id string)
	// NotForThisGroup, unless nil, is told of each entry acknowledged
	// without delivery because it is meant for another group.
	NotForThisGroup func()
}

// Inheritance tells a loop of the pending entries moved to its consumer
// name from the names of subscriptions that stopped without Close (see
// internal/lease's Adopter).
type Inheritance interface {
	// Moved receives after entries were moved: the loop drains its own
	// pending list again, before it reads anything new.
	Moved() <-chan struct{}
	// Watching reports whether entries may still be moved: meanwhile a
	// loop waits for new entries at most BlockTime at a time, so that it
	// comes to a move soon.
	Watching() bool
}

// DecodeFunc turns an entry into the message handed to the handler. An
// error wrapping ErrNotForThisGroup acknowledges the entry without
// delivering it (see Handling.NotForThisGroup).
type DecodeFunc func(e Entry) (*message.Message, error)

// ErrNotForThisGroup is wrapped by a DecodeFunc's error for an entry meant
// for another consumer group only (a replayed dead letter): it is
// acknowledged without delivery.
var ErrNotForThisGroup = errors.New("the entry is meant for another consumer group")

// DeadLetterFunc deals with an entry that cannot be decoded, delivered count
// times (it copies it to the dead-letter stream, or logs it), and logs what
// it did; an error leaves it pending, to come back.
type DeadLetterFunc func(ctx context.Context, e Entry, count int64, decodeErr error) error

// Waiter is a subscription's share of a reader that waits for new entries
// of many streams at once (see internal/sharedread).
type Waiter interface {
	// Covers reports whether the reader reads this stream while the
	// subscription does not wait: the subscription must not read new
	// entries on its own then.
	Covers() bool
	// Wait waits up to d (for ever when negative), or until ctx ends, for up
	// to count new entries. A failed read that covered the stream is
	// returned wrapped in ErrSharedRead: its reader has logged it.
	Wait(ctx context.Context, count int64, d time.Duration) (Waited, error)
	// Leave ends the subscription's share and returns the ids of entries
	// read for it and not taken, to hand back.
	Leave() []string
}

// Waited is what a Wait brought.
type Waited struct {
	Entries []Entry
	Full    bool      // more may wait
	Since   time.Time // for entries read while not waiting: when their read was sent; zero otherwise
}

// Health is told of failed calls and of the first success after them.
type Health interface {
	Failed(err error)
	Recovered()
}

// Counters are the counters and gauges of a Subscriber's loops (see
// valkeystream.Stats for what each counts).
type Counters struct {
	Delivered, Acked, Nacked, Drained, Reclaimed atomic.Int64
	MissingBodies, InvalidEntries, Faults        atomic.Int64
	ReadAhead, InFlight                          atomic.Int64
	Nacks                                        NackCounters
	// Settled counts Acks that sent no XACK: the handling acknowledged
	// the entry itself (see Delivery.Settle).
	Settled atomic.Int64
}

// NackCounters count what came of Nacks: the waits before a redelivery,
// and the handlers' verdicts (valkeystream.RetryAfter and GiveUp).
type NackCounters struct {
	Waits, WaitNanos atomic.Int64
	// RetriesLater counts Nacks whose entry was deferred; LaterFallbacks
	// those that asked for it while the deferred set was full, and waited
	// the Nack delay instead.
	RetriesLater, LaterFallbacks atomic.Int64
	// GivenUp counts entries given up on: dead-lettered (or logged) and
	// acknowledged.
	GivenUp atomic.Int64
	// Deferred is a gauge: entries in the deferred sets.
	Deferred atomic.Int64
}

// nackWaited counts a wait of d before a Nacked message is delivered again.
func (c *Counters) nackWaited(d time.Duration) {
	if d > 0 {
		c.Nacks.Waits.Add(1)
		c.Nacks.WaitNanos.Add(int64(d))
	}
}
