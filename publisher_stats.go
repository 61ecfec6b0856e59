package valkeystream

import (
	"errors"
	"sync/atomic"
)

// PublisherStats are counters of a Publisher since it was created.
type PublisherStats struct {
	// Calls counts Publish calls, and FailedCalls those that returned an
	// error.
	Calls       int64
	FailedCalls int64
	// Messages counts messages the server accepted, and FailedMessages those
	// of failed calls that were not written (all of a call's messages when
	// it failed before sending).
	Messages       int64
	FailedMessages int64
	// RoundTrips counts the requests sent to the server (one XADD, or one
	// pipeline of them), and RoundTripMessages the messages they carried:
	// RoundTripMessages / RoundTrips is the mean number of messages per
	// round trip, which grows when concurrent calls share round trips.
	RoundTrips        int64
	RoundTripMessages int64
	// MaybeWrittenMessages counts messages of failed calls that may have
	// been written (see ErrMaybeWritten): neither in Messages nor in
	// FailedMessages.
	MaybeWrittenMessages int64
	// Verbs names the newer stream verbs of the server that the Publisher
	// found out last (serverinfo's names, such as
	// "idempotent-add,acked-trim", or "baseline"; see
	// docs/server-verbs.md). Empty until a Publish needed them: only
	// IdempotentWindow and Retention do.
	Verbs string
}

type publisherCounters struct {
	calls, failedCalls, messages, failedMessages, roundTrips, roundTripMessages atomic.Int64
	maybeWritten                                                                atomic.Int64
}

// published counts a Publish call of n messages that returned err.
func (c *publisherCounters) published(n int, err error) {
	c.calls.Add(1)
	if err == nil {
		c.messages.Add(int64(n))
		return
	}
	c.failedCalls.Add(1)
	failed, maybe := n, 0
	var pe *PublishError
	if errors.As(err, &pe) && (pe.NotSent != nil || pe.MaybeWritten != nil) {
		failed, maybe = len(pe.NotSent), len(pe.MaybeWritten)
	}
	c.failedMessages.Add(int64(failed))
	c.maybeWritten.Add(int64(maybe))
	c.messages.Add(int64(n - failed - maybe))
}

// roundTrip counts a request to the server carrying n messages.
func (c *publisherCounters) roundTrip(n int) {
	if c == nil {
		return
	}
	c.roundTrips.Add(1)
	c.roundTripMessages.Add(int64(n))
}

// Stats returns the Publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	c := p.stats
	return PublisherStats{
		Calls:             c.calls.Load(),
		FailedCalls:       c.failedCalls.Load(),
		Messages:          c.messages.Load(),
		FailedMessages:    c.failedMessages.Load(),
		RoundTrips:        c.roundTrips.Load(),
		RoundTripMessages: c.roundTripMessages.Load(),

		MaybeWrittenMessages: c.maybeWritten.Load(),
		Verbs:                p.verbs.last(),
	}
}
