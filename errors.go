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

	// ErrInvalidEntry is wrapped by errors about a stream entry that cannot
	// be decoded into a message.
	ErrInvalidEntry = errors.New("valkeystream: invalid entry")

	// ErrDeliveryLimit is wrapped, together with the handler's error, by the
	// error that the [DeliveryLimit] middleware returns when a handler fails
	// on a delivery at or past the limit. Match it in the filter of
	// Watermill's middleware.PoisonQueueWithFilter.
	ErrDeliveryLimit = errors.New("valkeystream: delivery limit reached")

	// ErrDuplicateInProgress is returned by the [Deduplicator] middleware,
	// which makes the router Nack the message, when another handling of the
	// same message is in progress and did not end within BusyWait. The
	// message comes back later: then it is skipped if that handling
	// succeeded, and handled if it failed.
	ErrDuplicateInProgress = errors.New("valkeystream: the message is being handled elsewhere; it will come back")
)

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
	if errors.As(e.Err, &reply) {
		// The server refused: say what usually causes that.
		msg += "; check that the key holds a stream (or is free) and that the client may run XGROUP"
	}
	return msg
}

func (e *GroupCreateError) Unwrap() error { return e.Err }

// PublishError is returned by Publish when some messages were not written.
// The other messages of the call were accepted by the server.
type PublishError struct {
	Topic   string   // the topic passed to Publish
	NotSent []string // UUIDs of the messages that were not written, in call order
	Total   int      // how many messages the call carried
	Err     error    // the first failure
}

func (e *PublishError) Error() string {
	return fmt.Sprintf("valkeystream: %d of %d messages not written to topic %q (uuids %s): %v",
		len(e.NotSent), e.Total, e.Topic, strings.Join(e.NotSent, ", "), e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }
