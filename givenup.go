package valkeystream

import (
	"context"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// A handling that ended in a dead letter succeeded as far as the router is
// concerned (the message is Acked), but its handler never did the work. A
// [Deduplicator] around it must not mark the message done, or a replay of
// the dead letter (valkeystream dead replay) would be skipped as a
// duplicate and never handled: the Deduplicator puts a flag in the
// delivery's context, and [DeadLetter] and [DeliveryLimit] raise it when they
// give up on the message. The flag lives in the context of that one
// delivery, never in the message's metadata, so no published or replayed
// message can carry it.

// givenUpKey is the context key of a delivery's given-up flag.
type givenUpKey struct{}

// withGivenUpFlag returns msg's context with a fresh given-up flag, and the
// flag.
func withGivenUpFlag(ctx context.Context) (context.Context, *atomic.Bool) {
	flag := new(atomic.Bool)
	return context.WithValue(ctx, givenUpKey{}, flag), flag
}

// lowerGivenUp lowers the given-up flag of msg's delivery, if a
// Deduplicator put one there: an attempt begins (middleware.Retry outside
// DeadLetter or DeliveryLimit runs them again), and only the last one's
// outcome counts.
func lowerGivenUp(msg *message.Message) {
	if flag, ok := msg.Context().Value(givenUpKey{}).(*atomic.Bool); ok {
		flag.Store(false)
	}
}

// markGivenUp raises the given-up flag of msg's delivery, if a
// Deduplicator put one there.
func markGivenUp(msg *message.Message) {
	if flag, ok := msg.Context().Value(givenUpKey{}).(*atomic.Bool); ok {
		flag.Store(true)
	}
}

// isGivenUp reports whether a DeadLetter or DeliveryLimit raised the
// given-up flag of the delivery whose context is ctx.
func isGivenUp(ctx context.Context) bool {
	flag, ok := ctx.Value(givenUpKey{}).(*atomic.Bool)
	return ok && flag.Load()
}
