package partition

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// HandOver gives the messages of an owned partition's loop to the
// subscription's handlers, fenced by the ownership (Owned.Fence):
//   - a message is offered to a handler only while the fence is valid, and
//     the offer is withdrawn the moment it stops being valid (a lapse, or
//     the clock reaching the fence while the send waits for a handler):
//     the message is Nacked, stays pending for the next owner, and the
//     partition's loop stops;
//   - every message handed over has a context that the fence ends (see
//     Fence.Context): when the ownership may lapse, the handlers holding
//     the partition's messages see their contexts end;
//   - a Go channel send cannot check a clock at the instant a handler
//     takes the message, so a process frozen while a send waits (SIGSTOP,
//     a VM pause) completes it when it resumes, before any of its
//     goroutines runs a check. Such a message's context has ended by the
//     time the handler can ask (its Err checks the clock): a handler that
//     checks its context before its side effects never acts on it. It is
//     counted (Late), logged, and the partition's loop stops.
type HandOver struct {
	// Fence fences the hand-over. Required.
	Fence *Fence
	// Out is where handlers take the messages. Required.
	Out chan<- *message.Message
	// Stop stops the partition's loop (its In is closed once it has
	// ended). Required.
	Stop func()
	// Mark, unless nil, is called on each message before it is offered
	// (e.g. to set metadata).
	Mark func(*message.Message)
	// Late, unless nil, is called for each message handed over after its
	// fence stopped being valid.
	Late func()
	// Logger logs the refusals; nil: none.
	Logger watermill.LoggerAdapter
}

// Run hands over the messages of in (the partition loop's output channel)
// until it is closed; a message not taken before loopCtx (the loop's
// context) ends is Nacked. Then, while subCtx (the subscription's context)
// has not ended, it waits until the last message handed over was Acked or
// Nacked, however long its handler takes: a partition given to another
// member on a rebalance is released only after that, so that the next
// owner never handles it alongside.
func (h HandOver) Run(loopCtx, subCtx context.Context, in <-chan *message.Message) {
	if h.Logger == nil {
		h.Logger = watermill.NopLogger{}
	}
	var last *message.Message
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for msg := range in {
		if h.offer(loopCtx, msg, timer) {
			last = msg
		}
	}
	if last != nil && subCtx.Err() == nil {
		select {
		case <-last.Acked():
		case <-last.Nacked():
		case <-subCtx.Done():
		}
	}
}

// offer offers msg until a handler takes it (true), the fence stops being
// valid, or ctx ends.
func (h HandOver) offer(ctx context.Context, msg *message.Message, timer *time.Timer) bool {
	if h.Mark != nil {
		h.Mark(msg)
	}
	msg.SetContext(h.Fence.Context(msg.Context()))
	for {
		left := h.Fence.remaining()
		if left <= 0 || h.Fence.lapsed.Err() != nil {
			h.refuse(msg)
			return false
		}
		timer.Reset(left)
		select {
		case h.Out <- msg:
			if !h.Fence.Valid() {
				h.late(msg)
			}
			return true
		case <-timer.C:
			// The fence's time as it was when armed: a renewal may have
			// moved it since; look again.
		case <-h.Fence.Lapsed():
			h.refuse(msg)
			return false
		case <-ctx.Done():
			msg.Nack() // no handler took it: it stays pending, for the next owner
			return false
		}
	}
}

// refuse withdraws msg, whose fence is no longer valid, and stops the loop.
func (h HandOver) refuse(msg *message.Message) {
	h.Logger.Error("Not handing over a message of a partition whose ownership may lapse or was lost; the partition's loop stops", msg.Context().Err(),
		watermill.LogFields{"message_uuid": msg.UUID})
	h.Stop()
	msg.Nack()
}

// late deals with msg, taken by a handler after its fence stopped being
// valid: its context has ended (Err ends it), and the loop stops.
func (h HandOver) late(msg *message.Message) {
	err := msg.Context().Err()
	if h.Late != nil {
		h.Late()
	}
	h.Logger.Error("A message of a partition was taken by a handler after the ownership may have lapsed (the process stalled while offering it); its context has ended, and the partition's loop stops", err,
		watermill.LogFields{"message_uuid": msg.UUID})
	h.Stop()
}
