package valkeystream

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrInvalidConfig is wrapped by every configuration error; the wrapping
	// message names the field.
	ErrInvalidConfig = errors.New("valkeystream: invalid config")

	// ErrSubscriberClosed is returned by Subscribe after Close.
	ErrSubscriberClosed = errors.New("valkeystream: subscriber is closed")

	// ErrPublisherClosed is returned by Publish after Close.
	ErrPublisherClosed = errors.New("valkeystream: publisher is closed")

	// ErrInvalidMessage is wrapped by errors about a message that cannot be
	// written: an empty UUID or a metadata key that collides with a reserved
	// field.
	ErrInvalidMessage = errors.New("valkeystream: invalid message")

	// ErrNotAtomic is wrapped by the errors of an [ExactlyOnce] handling
	// whose outputs and Ack cannot be one step: a message not delivered by
	// a consumer group, a Publisher of another client, keys in more than
	// one cluster hash slot, or a message published after its handler
	// returned. The handling fails; nothing of it is written.
	ErrNotAtomic = errors.New("valkeystream: the outputs and the Ack cannot be one atomic step")

	// ErrPartitionCount is wrapped by the error of a Publish or Subscribe
	// of a partitioned topic whose partition count on the server differs
	// from the one declared in the config: all Publishers and Subscribers
	// of a topic must declare one count (docs/partitions.md).
	ErrPartitionCount = errors.New("valkeystream: the topic is declared with another partition count")

	// ErrInvalidEntry is wrapped by errors about a stream entry that cannot
	// be decoded into a message.
	ErrInvalidEntry = errors.New("valkeystream: invalid entry")

	// ErrNotReplicated is wrapped by the error of a Publish with
	// PublisherConfig.WaitReplicas when fewer replicas than asked
	// acknowledged the entries within WaitTimeout (or the answer was lost).
	// The entries were written on the master: they may survive, so
	// publishing again may store duplicates, but a failover may also lose
	// them.
	ErrNotReplicated = errors.New("valkeystream: not acknowledged by enough replicas")

	// ErrMaybeWritten is matched (errors.Is) by a *PublishError whose
	// MaybeWritten lists messages: they were sent, and the connection failed
	// before the server answered, so they may be in the stream. Publishing
	// them again may store duplicates, which consumers drop by UUID (see
	// Deduplicator). The client never sends an XADD twice itself.
	ErrMaybeWritten = errors.New("valkeystream: the messages may have been written")

	// ErrDeliveryLimit is wrapped, together with the handler's error, by the
	// error that the [DeliveryLimit] middleware returns when a handler fails
	// on a delivery at or past the limit. Match it in the filter of
	// Watermill's middleware.PoisonQueueWithFilter.
	ErrDeliveryLimit = errors.New("valkeystream: delivery limit reached")

	// ErrRetryLater is wrapped by the error [RetryAfter] returns: the
	// handler asked for its message to come back after a delay of its
	// choosing. See [IsFinal].
	ErrRetryLater = errors.New("valkeystream: retry later")

	// ErrGiveUp is wrapped, together with the reason, by the error [GiveUp]
	// returns: the handler gave up on its message, which is dead-lettered
	// at once. See [IsFinal].
	ErrGiveUp = errors.New("valkeystream: given up")

	// ErrInvalidWrite is wrapped by the error of a [Step] write that
	// cannot be added: a bad argument, or a key the step already writes as
	// another type. Nothing is added.
	ErrInvalidWrite = errors.New("valkeystream: invalid state write")

	// ErrStateChanged is wrapped by the error of an [ExactlyOnce] handling
	// whose step found a key or field other than its handler expected
	// ([Step.Expect], [Step.ExpectField]): the step wrote nothing, and the
	// message comes back, so that its handler reads the state again.
	ErrStateChanged = errors.New("valkeystream: the state the step expected has changed")

	// ErrDuplicateInProgress is returned by the [Deduplicator] middleware,
	// which makes the router Nack the message, when another handling of the
	// same message is in progress and did not end within BusyWait. The
	// message comes back later: then it is skipped if that handling
	// succeeded, and handled if it failed.
	ErrDuplicateInProgress = errors.New("valkeystream: the message is being handled elsewhere; it will come back")
)

// StateChangedError is the error of a step whose handler expected a key
// or a hash field to hold a value it no longer holds ([Step.Expect],
// [Step.ExpectField]). It wraps [ErrStateChanged].
type StateChangedError struct {
	// Key is the key, Field the hash field ("" for Expect), and Found
	// the value the step found ("" for a missing one).
	Key, Field, Found string
}

func (e *StateChangedError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%v: field %q of hash %q holds %q", ErrStateChanged, e.Field, e.Key, e.Found)
	}
	return fmt.Sprintf("%v: key %q holds %q", ErrStateChanged, e.Key, e.Found)
}

func (e *StateChangedError) Unwrap() error { return ErrStateChanged }

// GroupCreateError is returned by Subscribe and SubscribeInitialize when the
// server refuses to create the consumer group with any reply other than
// BUSYGROUP (the group already exists, which is success).
type GroupCreateError struct {
	Key   string // the stream key
	Group string // the consumer group
	Err   error  // the server's reply or the connection error
}

func (e *GroupCreateError) Error() string {
	msg := fmt.Sprintf("valkeystream: creating consumer group %q on stream %q (XGROUP CREATE ... MKSTREAM): %v",
		e.Group, e.Key, e.Err)
	var reply redis.Error
	switch {
	case redis.HasErrorPrefix(e.Err, "OOM"):
		msg += "; the server is full (maxmemory with noeviction): a new group needs memory, free some or raise maxmemory"
	case errors.As(e.Err, &reply):
		// The server refused: say what usually causes that.
		msg += "; check that the key holds a stream (or is free) and that the client may run XGROUP"
	}
	return msg
}

func (e *GroupCreateError) Unwrap() error { return e.Err }

// PublishError is returned by Publish when some messages were not written,
// may have been written (the connection failed after they were sent: see
// ErrMaybeWritten), or, when Err wraps [ErrNotReplicated], were written on
// the master without the acknowledgement of enough replicas. The other
// messages of the call were accepted (and acknowledged).
type PublishError struct {
	Topic string // the topic passed to Publish
	// NotSent lists the UUIDs of the messages that were not written (the
	// server refused them, or they were never sent) or, with
	// ErrNotReplicated, not acknowledged by enough replicas, in call order.
	NotSent []string
	// MaybeWritten lists the UUIDs of the messages sent on a connection that
	// failed before the server answered, in call order: each may be in the
	// stream or not.
	MaybeWritten []string
	Total        int   // how many messages the call carried
	Err          error // the first failure
}

func (e *PublishError) Error() string {
	if errors.Is(e.Err, ErrNotReplicated) {
		return fmt.Sprintf("valkeystream: %d of %d messages written to topic %q without enough replica acknowledgements (uuids %s): %v; they may be lost in a failover, and publishing them again may store duplicates",
			len(e.NotSent), e.Total, e.Topic, strings.Join(e.NotSent, ", "), e.Err)
	}
	var parts []string
	if len(e.NotSent) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d messages not written to topic %q (uuids %s)",
			len(e.NotSent), e.Total, e.Topic, strings.Join(e.NotSent, ", ")))
	}
	if len(e.MaybeWritten) > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d messages may have been written to topic %q, the connection failed before the server answered (uuids %s; publishing them again may store duplicates)",
			len(e.MaybeWritten), e.Total, e.Topic, strings.Join(e.MaybeWritten, ", ")))
	}
	return "valkeystream: " + strings.Join(parts, "; ") + ": " + e.Err.Error()
}

// Is reports whether target is ErrMaybeWritten and some messages may have
// been written.
func (e *PublishError) Is(target error) bool {
	return target == ErrMaybeWritten && len(e.MaybeWritten) > 0
}

func (e *PublishError) Unwrap() error { return e.Err }
