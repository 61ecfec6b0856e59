package valkeystream

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys of a dead letter: why it failed and where it came from. Both
// kinds of dead letter carry all of them: a message that [DeadLetter] or
// [DeliveryLimit] gave up on, and an entry that a [Subscriber] could not
// decode. They differ from the Metadata* keys a Subscriber sets on delivery,
// which are replaced when the dead letter is itself consumed.
const (
	// MetadataError is why the message was given up: the error of the
	// handler's last failed delivery, or the decode error of an undecodable
	// entry.
	MetadataError = "valkeystream_error"
	// MetadataOriginalTopic is the topic the message was consumed from,
	// without KeyPrefix. Empty when the message did not come through a
	// Watermill router, which is where [DeadLetter] learns the topic.
	MetadataOriginalTopic = "valkeystream_original_topic"
	// MetadataOriginalStream is the stream key the message was read from.
	MetadataOriginalStream = "valkeystream_original_stream"
	// MetadataOriginalEntryID is the id of the entry in the original stream.
	MetadataOriginalEntryID = "valkeystream_original_entry_id"
	// MetadataOriginalGroup is the consumer group that gave up on it.
	MetadataOriginalGroup = "valkeystream_original_group"
	// MetadataOriginalConsumer is the consumer whose delivery failed last.
	MetadataOriginalConsumer = "valkeystream_original_consumer"
	// MetadataOriginalDeliveryCount is the server's delivery count of that
	// last delivery, in decimal.
	MetadataOriginalDeliveryCount = "valkeystream_original_delivery_count"
)

// MetadataReplayGroup, on a message in a stream, names the one consumer
// group it is for: subscriptions of other groups acknowledge it without
// delivering it (counted in Stats.NotForThisGroup), and the subscriptions of
// that group remove it from the message they deliver (so a handler that
// forwards the message does not make it another replay). `valkeystream dead
// replay` sets it to the group that gave up on the dead letter, unless told
// to replay to every group. Empty or absent: every group. Fan-out
// subscriptions deliver it as any message.
const MetadataReplayGroup = "valkeystream_replay_group"

// DeadLetterConfig configures the [DeadLetter] middleware. DeadLetter takes a
// copy, so later changes by the caller have no effect.
type DeadLetterConfig struct {
	// Publisher publishes dead letters. Required. It may be a valkeystream
	// [Publisher] or any other Watermill publisher.
	Publisher message.Publisher

	// MaxDeliveries is the delivery on which a failure is final: when the
	// handler fails on a delivery whose count (see [DeliveryCount]) is at
	// least MaxDeliveries, the message is dead-lettered instead of Nacked.
	// 1 dead-letters on the first failure. Required, at least 1.
	MaxDeliveries int

	// Topic is where dead letters are published. Default: the topic the
	// message was consumed from (as the Watermill router reports it) plus
	// Suffix. Set it when the handler does not run in a router.
	Topic string

	// Suffix names the dead-letter topic of the topic a message was
	// consumed from, when Topic is not set. Set it to the Subscriber's
	// SubscriberConfig.DeadLetterSuffix, so that failed messages and
	// undecodable entries of a topic land in the same stream. Default:
	// DefaultDeadLetterSuffix, the Subscriber's default.
	Suffix string

	// CrashLimit, when positive, dead-letters a message that arrives with a
	// delivery count above it without calling the handler. It stops a
	// message whose handler never returns a failure because it ends the
	// process (a crash, an out-of-memory kill, os.Exit): the server's count
	// grows with each restart, but MaxDeliveries only judges failures that
	// were returned. Counts also grow for entries that were merely queued
	// in a batch when a consumer died, so set it well above MaxDeliveries.
	// It must be 0 or greater than MaxDeliveries. Default: 0, off.
	CrashLimit int
}

func (c *DeadLetterConfig) setDefaults() {
	if c.Suffix == "" {
		c.Suffix = DefaultDeadLetterSuffix
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps [ErrInvalidConfig] and names the field. Validate does not change
// c.
func (c DeadLetterConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Publisher == nil:
		return fmt.Errorf("%w: DeadLetterConfig.Publisher is required: pass the publisher of the dead-letter topic", ErrInvalidConfig)
	case c.MaxDeliveries < 1:
		return fmt.Errorf("%w: DeadLetterConfig.MaxDeliveries is %d: it must be at least 1 (the delivery on which a failure is final)",
			ErrInvalidConfig, c.MaxDeliveries)
	case c.Suffix == NoDeadLetter:
		return fmt.Errorf("%w: DeadLetterConfig.Suffix is %q, which turns a Subscriber's dead letters off: name a dead-letter topic", ErrInvalidConfig, c.Suffix)
	case c.CrashLimit != 0 && c.CrashLimit <= c.MaxDeliveries:
		return fmt.Errorf("%w: DeadLetterConfig.CrashLimit is %d: it must be 0 (off) or greater than MaxDeliveries (%d)",
			ErrInvalidConfig, c.CrashLimit, c.MaxDeliveries)
	}
	return nil
}

// DeadLetter returns a handler middleware that stops a message that keeps
// failing. It runs the handler; when the handler fails on a delivery whose
// server delivery count is at least MaxDeliveries, it publishes a copy of the
// message to the dead-letter topic and reports success, so that the router
// Acks the original. The copy has the same UUID, payload and metadata, except
// that the per-delivery keys (MetadataDeliveryCount, MetadataEntryID,
// MetadataStream, MetadataGroup, MetadataConsumer) move to the
// MetadataOriginal* keys; MetadataError holds the handler's error.
//
// If publishing the dead letter fails, the middleware returns the handler's
// error joined with the publish error: the message is Nacked, comes back, and
// is dead-lettered on its next failing delivery. Nothing is lost, but a dead
// letter can be published twice (when the Ack after a publish is lost), so
// deduplicate dead letters by MetadataOriginalStream and
// MetadataOriginalEntryID (not by UUID: a dead letter published again after a
// fix keeps its UUID, and may fail again).
//
// A handler that gives up ([GiveUp], an error wrapping [ErrGiveUp]) is
// dead-lettered at once, whatever the count, with its reason as
// MetadataError; the Subscriber then sees an Ack and writes no dead letter
// of its own. If that publish fails, msg is Nacked as a plain failure.
//
// Failures below the limit pass through unchanged. A message without
// delivery count metadata (count 0, not read by a Subscriber) is never
// dead-lettered. Neither is one whose handler failed after the delivery's
// context ended (the subscription is closing, or its context's deadline
// passed): it stays pending. A handler that ends the process never returns a
// failure; see CrashLimit for those.
//
// Add it before (outside) middleware.Retry, so that every delivery gets its
// in-process retries and the limit sees the delivery's final error, and
// before middleware.Recoverer, so that a handler that panics is dead-lettered
// too:
//
//	router.AddMiddleware(deadLetter, retry.Middleware, middleware.Recoverer)
//
// logger logs each dead letter at Error level; nil logs nothing. See
// docs/dead-letters.md.
func DeadLetter(config DeadLetterConfig, logger watermill.LoggerAdapter) (message.HandlerMiddleware, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	d := deadLetter{config: config, logger: logger}
	return d.middleware, nil
}

type deadLetter struct {
	config DeadLetterConfig
	logger watermill.LoggerAdapter
}

func (d deadLetter) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		// The delivery's own context, before the handler or an inner
		// middleware replaces it.
		ctx := msg.Context()
		lowerGivenUp(msg) // this attempt's outcome decides (givenup.go)
		if n := DeliveryCount(msg); d.config.CrashLimit > 0 && n > d.config.CrashLimit && ctx.Err() == nil {
			return nil, d.giveUp(ctx, msg, fmt.Errorf("%w: delivered %d times, more than CrashLimit %d, without a failure returned by the handler: it may end the process",
				ErrDeliveryLimit, n, d.config.CrashLimit))
		}
		produced, err := h(msg)
		if errors.Is(err, ErrGiveUp) && ctx.Err() == nil {
			// The handler gave up (GiveUp): a dead letter now, whatever
			// the count, and this one only.
			return nil, d.handlerGaveUp(ctx, msg, err)
		}
		if err == nil || !isFinalFailure(ctx, msg, d.config.MaxDeliveries) {
			return produced, err
		}
		return nil, d.giveUp(ctx, msg, err)
	}
}

// handlerGaveUp publishes the dead letter of msg, whose handler gave up on
// it with err (see GiveUp), with the handler's reason as its error. If that
// fails, the returned error makes the router Nack msg as a plain failure,
// without the Subscriber's own dead letter: it comes back, and is given up
// again on its next delivery.
func (d deadLetter) handlerGaveUp(ctx context.Context, msg *message.Message, err error) error {
	reason, ok := msg.Metadata[MetadataGiveUp]
	if !ok {
		reason = err.Error()
	}
	o := deliveryOrigin(ctx, msg)
	if perr := d.publish(ctx, msg, o, errors.New(reason)); perr != nil {
		countDeadLetter(o, deadLetterPublishFailed)
		delete(msg.Metadata, MetadataGiveUp)
		return errors.Join(err, perr)
	}
	countDeadLetter(o, deadLetterPublished)
	markGivenUp(msg) // a Deduplicator around it must not mark it done (givenup.go)
	return nil
}

// giveUp publishes the dead letter of msg, which failed with cause, and
// returns nil, so that the router Acks msg; or, when the dead letter could
// not be published, cause joined with why, so that msg is Nacked and comes
// back.
func (d deadLetter) giveUp(ctx context.Context, msg *message.Message, cause error) error {
	o := deliveryOrigin(ctx, msg)
	if err := d.publish(ctx, msg, o, cause); err != nil {
		countDeadLetter(o, deadLetterPublishFailed)
		return errors.Join(cause, err)
	}
	countDeadLetter(o, deadLetterPublished)
	markGivenUp(msg) // a Deduplicator around it must not mark it done (givenup.go)
	return nil
}

// publish publishes the dead letter of msg, delivered from o, which failed
// with cause.
func (d deadLetter) publish(ctx context.Context, msg *message.Message, o origin, cause error) error {
	topic := d.config.Topic
	if topic == "" {
		if o.topic == "" {
			return fmt.Errorf("valkeystream: dead letter of message %s: its topic is unknown (it did not come through a Watermill router); set DeadLetterConfig.Topic",
				msg.UUID)
		}
		topic = o.topic + d.config.Suffix
	}

	dead := deadLetterRecord(msg, o, cause.Error())
	// The publish is not cut short by a deadline that made the handler
	// fail (middleware.Timeout); a closing subscription never gets here.
	// Nor does it join the step of an ExactlyOnce around (step.go): a
	// dead letter is written before the handling ends, as without one.
	dead.SetContext(context.WithValue(context.WithoutCancel(ctx), stepKey{}, (*step)(nil)))

	if err := d.config.Publisher.Publish(topic, dead); err != nil {
		return fmt.Errorf("valkeystream: publishing message %s to dead-letter topic %q: %w", msg.UUID, topic, err)
	}
	d.logger.Error("Message given up; published to the dead-letter topic", cause, watermill.LogFields{
		"message_uuid":      msg.UUID,
		"topic":             o.topic,
		"entry_id":          o.entryID,
		"delivery_count":    o.deliveryCount,
		"dead_letter_topic": topic,
	})
	return nil
}

// deadLetterRecord returns the dead letter of msg, a delivered message
// given up with cause from its origin o: the same UUID, payload and
// metadata, but the per-delivery keys and the verdict keys, with o and
// cause under the dead-letter keys. The DeadLetter middleware publishes it;
// a Subscriber writes it for a message whose handler gave up (GiveUp).
func deadLetterRecord(msg *message.Message, o origin, cause string) *message.Message {
	dead := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		dead.Metadata[k] = v
	}
	for _, k := range deliveryKeys {
		delete(dead.Metadata, k)
	}
	for _, k := range verdictKeys {
		delete(dead.Metadata, k)
	}
	o.stamp(dead.Metadata, cause)
	return dead
}

// DeliveryLimit returns a handler middleware for Watermill's poison queue. When
// the handler fails on a delivery whose server delivery count is at least
// maxDeliveries, it sets MetadataError and the MetadataOriginal* keys on the
// message and returns an error that wraps both [ErrDeliveryLimit] and the
// handler's error, so that
//
//	middleware.PoisonQueueWithFilter(pub, "orders.poison", func(err error) bool {
//		return errors.Is(err, valkeystream.ErrDeliveryLimit)
//	})
//
// added before (outside) it publishes the message to the poison topic and
// the router Acks it. Other failures pass through unchanged and are Nacked.
// The message keeps its per-delivery metadata as well, since it is the
// delivered message itself that the poison queue publishes.
//
// As with [DeadLetter], a message without delivery count metadata is never
// marked, nor one whose handler failed after the delivery's context was
// cancelled. maxDeliveries must be at least 1; otherwise the error wraps
// [ErrInvalidConfig]. Add middleware.Retry and middleware.Recoverer after
// (inside) it.
func DeliveryLimit(maxDeliveries int) (message.HandlerMiddleware, error) {
	if maxDeliveries < 1 {
		return nil, fmt.Errorf("%w: DeliveryLimit maxDeliveries is %d: it must be at least 1 (the delivery on which a failure is final)",
			ErrInvalidConfig, maxDeliveries)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			lowerGivenUp(msg) // this attempt's outcome decides (givenup.go)
			produced, err := h(msg)
			if err == nil || !isFinalFailure(ctx, msg, maxDeliveries) {
				return produced, err
			}
			o := deliveryOrigin(ctx, msg)
			o.stamp(msg.Metadata, err.Error())
			countDeadLetter(o, deadLetterMarked)
			markGivenUp(msg) // the poison queue publishes it: not done (givenup.go)
			return produced, fmt.Errorf("%w (delivery %s of message %s, limit %d): %w",
				ErrDeliveryLimit, o.deliveryCount, msg.UUID, maxDeliveries, err)
		}
	}, nil
}

// isFinalFailure reports whether a failed delivery of msg, whose context was
// ctx when the handler was called, is the one to give up on: its count
// reached maxDeliveries and the failure is not that of a closing
// subscription.
func isFinalFailure(ctx context.Context, msg *message.Message, maxDeliveries int) bool {
	n := DeliveryCount(msg)
	return n > 0 && n >= maxDeliveries && ctx.Err() == nil
}

// deliveryKeys are the metadata keys a Subscriber sets on each delivery.
var deliveryKeys = [...]string{MetadataDeliveryCount, MetadataEntryID, MetadataStream, MetadataGroup, MetadataConsumer}

// invalidEntryRecord returns the dead letter of an entry that could not be
// decoded, as a message that [DefaultMarshaler] writes and reads back
// unchanged. Its UUID is the one the entry holds (its uuid field, or the
// field of watermill-redisstream's layout) when that is not empty, else
// one derived from the stream key and the entry id (so that copying the same
// entry twice gives the same UUID); its payload is the payload field, or
// empty. Every other field becomes metadata under its own name, its value as
// text; then the origin and the decode error are stamped over it.
func invalidEntryRecord(fields map[string]any, o origin, decodeErr error) *message.Message {
	uuid := storedUUID(fields)
	if uuid == "" {
		uuid = entryUUID(o.stream, o.entryID)
	}
	record := message.NewMessage(uuid, message.Payload(fieldText(fields[FieldPayload])))
	for k, v := range fields {
		if k != FieldUUID && k != FieldPayload {
			record.Metadata[k] = fieldText(v)
		}
	}
	o.stamp(record.Metadata, decodeErr.Error())
	return record
}

// fieldText returns a raw field value as text. The server always answers
// strings; other types can only come from a custom source and are formatted.
func fieldText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

// entryUUIDSpace is the namespace of the name-based UUIDs of entries.
var entryUUIDSpace = [16]byte{0x19, 0x9b, 0x87, 0x10, 0x99, 0x5a, 0x49, 0x8c, 0xbf, 0xcb, 0xb1, 0x61, 0x2f, 0xe1, 0xdf, 0xe3}

// entryUUID returns a name-based (version 5, RFC 9562) UUID of the entry id of
// stream key: the same entry always gets the same UUID.
func entryUUID(key, id string) string {
	h := sha1.New()
	h.Write(entryUUIDSpace[:])
	// The length prefix keeps the name unambiguous whatever the key holds.
	h.Write([]byte(strconv.Itoa(len(key)) + ":" + key + id))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
