package valkeystream

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream/internal/loop"
)

// Verdicts: what a handler can ask of a message beyond Ack and Nack,
// through Watermill's own return values. A verdict is a metadata key set on
// the delivered message; the Subscriber reads it when the message is
// Nacked. A value published under one of these keys is removed on delivery:
// only the handler of a delivery gives its verdict. See docs/design.md,
// "Settling".
const (
	// MetadataRetryAfter is set by [RetryAfter] and [NackAfter]: how long
	// the Nacked message waits before it comes back, as a Go duration.
	MetadataRetryAfter = loop.MetadataRetryAfter
	// MetadataGiveUp is set by [GiveUp] and [Reject]: why the handler gave
	// up on the message, which is dead-lettered on its Nack.
	MetadataGiveUp = loop.MetadataGiveUp
)

// RetryAfter marks msg to come back after d, while the subscription goes on
// with the next messages, and returns an error wrapping [ErrRetryLater] and
// err (which may be nil) for a router handler to return:
//
//	return nil, valkeystream.RetryAfter(msg, 30*time.Second, err)
//
// The router Nacks msg; the Subscriber keeps the entry pending for this
// consumer, holds it so that no peer reclaims it, and when d has passed
// claims it back (its delivery count grows by one, as after any Nack) and
// delivers it before anything queued. A plain Nack instead holds the next
// messages back until it is delivered again, after NackResendDelay.
//
// Bounds: a subscription keeps at most BatchSize such entries at once;
// beyond that a RetryAfter is a plain Nack (counted in
// [NackStats].RetryLaterFallbacks). When the subscription ends before d has
// passed, the entry is handed back so that a peer takes it when it is due,
// or after ClaimMinIdle if it is due later than that; a process that dies
// leaves it to the peers' claims after ClaimMinIdle, and a restart under
// the same consumer name delivers it at once. A d that is not positive
// makes a plain Nack. In fan-out (no consumer group) it is a plain Nack.
//
// middleware.Retry retries any error unless told otherwise: give it
// ShouldRetry with [IsFinal], or it calls the handler again at once.
func RetryAfter(msg *message.Message, d time.Duration, err error) error {
	mark(msg, MetadataRetryAfter, d.String())
	if err == nil {
		return fmt.Errorf("%w in %s", ErrRetryLater, d)
	}
	return fmt.Errorf("%w in %s: %w", ErrRetryLater, d, err)
}

// NackAfter marks msg to come back after d, as [RetryAfter] does, and Nacks
// it: for a handler that reads a subscription's channel itself. It returns
// what msg.Nack returns.
func NackAfter(msg *message.Message, d time.Duration) bool {
	mark(msg, MetadataRetryAfter, d.String())
	return msg.Nack()
}

// GiveUp marks msg as given up with reason, and returns an error wrapping
// [ErrGiveUp] and reason for a router handler to return:
//
//	return nil, valkeystream.GiveUp(msg, fmt.Errorf("card declined: %w", err))
//
// The router Nacks msg; the Subscriber copies it to the topic's dead-letter
// stream (its stream key plus SubscriberConfig.DeadLetterSuffix), in the
// layout of the [DeadLetter] middleware's dead letters with reason under
// [MetadataError], and acknowledges it: no more deliveries. With
// NoDeadLetter it is logged and acknowledged. If the copy fails, the entry
// stays pending and comes back through a claim after ClaimMinIdle (counted
// in [Stats].Faults), as an undecodable entry does.
//
// Inside the [DeadLetter] middleware, the middleware publishes the dead
// letter itself, at once whatever the delivery count, and the router Acks
// msg: one dead letter, in DeadLetter's topic. Give middleware.Retry
// ShouldRetry with [IsFinal], or it retries the handler first. In fan-out
// (no consumer group) the message is logged and skipped.
func GiveUp(msg *message.Message, reason error) error {
	mark(msg, MetadataGiveUp, giveUpReason(reason))
	if reason == nil {
		return ErrGiveUp
	}
	return fmt.Errorf("%w: %w", ErrGiveUp, reason)
}

// Reject marks msg as given up with reason, as [GiveUp] does, and Nacks it:
// for a handler that reads a subscription's channel itself. It returns what
// msg.Nack returns.
func Reject(msg *message.Message, reason error) bool {
	mark(msg, MetadataGiveUp, giveUpReason(reason))
	return msg.Nack()
}

// IsFinal reports whether err is a handler's verdict on its message
// ([RetryAfter], [GiveUp]), which retrying the handler in the process would
// override. Use it with middleware.Retry:
//
//	retry := middleware.Retry{
//		MaxRetries:  3,
//		ShouldRetry: func(p middleware.RetryParams) bool { return !valkeystream.IsFinal(p.Err) },
//	}
func IsFinal(err error) bool {
	return errors.Is(err, ErrGiveUp) || errors.Is(err, ErrRetryLater)
}

// mark sets the verdict key on msg, replacing the other verdict: the last
// verdict given counts.
func mark(msg *message.Message, key, value string) {
	if msg.Metadata == nil {
		msg.Metadata = make(message.Metadata)
	}
	delete(msg.Metadata, MetadataGiveUp)
	delete(msg.Metadata, MetadataRetryAfter)
	msg.Metadata.Set(key, value)
}

// giveUpReason is the text of reason, as the dead letter carries it.
func giveUpReason(reason error) string {
	if reason == nil {
		return "given up by the handler"
	}
	return reason.Error()
}

// verdictKeys are the metadata keys of the verdicts, which a dead letter
// does not carry.
var verdictKeys = [...]string{MetadataRetryAfter, MetadataGiveUp}
