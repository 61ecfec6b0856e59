package valkeystream

import (
	"sync/atomic"
	"time"

	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/partition"
)

// subscriberCounters are a Subscriber's counters: its loops', and the
// Subscriber's own.
type subscriberCounters struct {
	loop.Counters
	notForThisGroup atomic.Int64
	partitions      partition.DriverCounters // see partitionsub.go
}

// Stats are counters of a Subscriber since it was created, summed over its
// subscriptions. This is where what each counts is stated; the other
// documents link here.
type Stats struct {
	// Delivered counts messages a handler took from a subscription channel,
	// each redelivery after a Nack included.
	Delivered int64
	// Acked counts entries the server acknowledged (the sum of XACK
	// replies): handled messages, those acknowledged by the step of
	// ExactlyOnce with their outputs (counted when the message is Acked),
	// and entries acknowledged without delivery (missing bodies,
	// dead-lettered undecodable entries). An entry that another consumer
	// acknowledged first is not counted, nor one whose step found it
	// superseded.
	Acked int64
	// Nacks are the counters of Nacks, and of what handlers decided with
	// them (RetryAfter, GiveUp).
	Nacks NackStats
	// Drained counts own pending entries queued for delivery by a drain
	// after a start or a fault, whether or not they were delivered before
	// the subscription ended.
	Drained int64
	// Reclaimed counts idle entries claimed, with XAUTOCLAIM on the claim
	// beat or inside a read of new entries (XREADGROUP ... CLAIM, see
	// docs/server-verbs.md), and queued for delivery, whether or not they were delivered before the
	// subscription ended.
	Reclaimed int64
	// MissingBodies counts pending entries found trimmed or deleted from the
	// stream before they were handled: acknowledged and logged, never
	// delivered.
	MissingBodies int64
	// InvalidEntries counts entries that could not be decoded and were dealt
	// with: with a group, copied to the dead-letter stream (or, with
	// NoDeadLetter, logged) and acknowledged; in fan-out, logged and
	// skipped. An entry whose copy failed is counted in Faults instead and
	// stays pending, to be counted here when a later copy succeeds.
	InvalidEntries int64
	// Faults counts failed calls to the server: reads, claims, Nack claims,
	// Acks, hold beats, lease renewals, dead-letter copies and delayed
	// moves. Reads and claims back off before they retry; a failed hold beat
	// or lease renewal is tried again on its next beat.
	Faults int64

	// ReadAhead is a gauge: entries fetched from the server now waiting in
	// the subscriptions' queues to be delivered. With a group they are
	// pending for this consumer on the server although no handler has seen
	// them, so XINFO counts them as delivered (see docs/backlog.md).
	ReadAhead int64
	// InFlight is a gauge: messages taken from the queue and not settled
	// yet: being handed over, in a handler's hands, or waiting to be
	// delivered again after a Nack. At most one per subscription.
	InFlight int64

	// NotForThisGroup counts entries acknowledged without delivery because
	// they are meant for another consumer group only: dead letters replayed
	// to the group that gave up on them (MetadataReplayGroup).
	NotForThisGroup int64

	// Verbs names the stream verbs newer than Redis 6.2's that the
	// subscriptions use (docs/server-verbs.md): "baseline" for none, else
	// a comma-separated list such as "claim-in-read,ackdel". Empty until
	// the first group Subscribe has asked the server.
	Verbs string
}

// NackStats are the Nack counters of a Subscriber's [Stats].
type NackStats struct {
	// Nacked counts Nacks.
	Nacked int64
	// Waits counts Nacks after which the message waited before it was
	// delivered again (see NackResendDelay: by default every Nack but a
	// message's first); WaitSeconds is the sum of those waits. A
	// growing Waits is a message, or a handler, that keeps failing.
	Waits       int64
	WaitSeconds float64
	// RetriesLater counts Nacks of messages marked with [RetryAfter] or
	// [NackAfter] that were deferred: kept pending while the next messages
	// were delivered, to come back when due. RetryLaterFallbacks counts
	// those that found the subscription's deferred set full (BatchSize
	// entries) and were Nacked plainly instead (waiting NackResendDelay).
	// On a partitioned topic a RetryAfter is a plain Nack, counted in
	// neither.
	RetriesLater        int64
	RetryLaterFallbacks int64
	// GivenUp counts messages whose handler gave up on them ([GiveUp],
	// [Reject]) that the Subscriber dealt with: copied to the dead-letter
	// stream (or, with NoDeadLetter, logged) and acknowledged; in fan-out,
	// logged and skipped. A failed copy is counted in Faults instead. A
	// GiveUp inside the [DeadLetter] middleware is the middleware's (see
	// [DeadLetterCounts]): the Subscriber sees an Ack.
	GivenUp int64
	// Deferred is a gauge: entries Nacked with [RetryAfter] or [NackAfter]
	// waiting to come back, pending for this consumer and held by its
	// subscriptions. At most BatchSize per subscription.
	Deferred int64
}

// Stats returns the Subscriber's counters and gauges.
func (s *Subscriber) Stats() Stats {
	c := &s.stats
	return Stats{
		Delivered: c.Delivered.Load(),
		Acked:     c.Acked.Load(),
		Nacks: NackStats{
			Nacked:              c.Nacked.Load(),
			Waits:               c.Nacks.Waits.Load(),
			WaitSeconds:         time.Duration(c.Nacks.WaitNanos.Load()).Seconds(),
			RetriesLater:        c.Nacks.RetriesLater.Load(),
			RetryLaterFallbacks: c.Nacks.LaterFallbacks.Load(),
			GivenUp:             c.Nacks.GivenUp.Load(),
			Deferred:            c.Nacks.Deferred.Load(),
		},
		Drained:         c.Drained.Load(),
		Reclaimed:       c.Reclaimed.Load(),
		MissingBodies:   c.MissingBodies.Load(),
		InvalidEntries:  c.InvalidEntries.Load(),
		Faults:          c.Faults.Load(),
		ReadAhead:       c.ReadAhead.Load(),
		InFlight:        c.InFlight.Load(),
		NotForThisGroup: c.notForThisGroup.Load(),
		Verbs:           s.verbs.Path(),
	}
}
