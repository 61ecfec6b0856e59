package valkeystream

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream/internal/loop"
)

// Entry fields written by [DefaultMarshaler]. Every metadata key becomes a
// field of its own beside them, so `XRANGE key - +` shows a message as it is.
const (
	// FieldUUID holds the message UUID: the key to deduplicate on.
	FieldUUID = "uuid"
	// FieldPayload holds the message payload.
	FieldPayload = "payload"
)

// Metadata keys that a [Subscriber] sets on every delivered message. A value
// published under one of these keys is replaced on delivery, so a dead letter
// keeps where it came from under the MetadataOriginal* keys instead (see
// [DeadLetter]).
const (
	// MetadataDeliveryCount is how many times the entry has been delivered,
	// in decimal. With a consumer group it is the server's count from the
	// pending entries list: 1 on the first delivery, and it grows with each
	// Nack, restart drain and reclaim. In fan-out it counts deliveries within
	// the subscription. Read it with [DeliveryCount].
	MetadataDeliveryCount = loop.MetadataDeliveryCount
	// MetadataEntryID is the stream entry id, such as "1700000000000-0".
	MetadataEntryID = "valkeystream_entry_id"
	// MetadataStream is the stream key the entry was read from.
	MetadataStream = "valkeystream_stream"
	// MetadataGroup is the consumer group (empty in fan-out).
	MetadataGroup = "valkeystream_group"
	// MetadataConsumer is the consumer name the entry was delivered to
	// (empty in fan-out).
	MetadataConsumer = "valkeystream_consumer"
)

// DeliveryCount returns the delivery count a [Subscriber] set on msg, or 0 if
// the message carries none.
func DeliveryCount(msg *message.Message) int {
	n, err := strconv.Atoi(msg.Metadata.Get(MetadataDeliveryCount))
	if err != nil {
		return 0
	}
	return n
}

// Marshaler encodes a message into the field-value pairs of a stream entry.
type Marshaler interface {
	// Marshal returns the entry's fields and values, alternating, as XADD
	// takes them. An error wraps ErrInvalidMessage when the message itself
	// cannot be written.
	Marshal(topic string, msg *message.Message) ([]any, error)
}

// Unmarshaler decodes the fields of a stream entry into a message. It is
// called from several subscriptions at once, and a subscription decodes its
// next entry while a handler still works on the previous message, so it must
// be safe for concurrent use and must not reuse memory that a message it
// returned still refers to.
type Unmarshaler interface {
	// Unmarshal returns the message held by an entry's fields. An error
	// should wrap ErrInvalidEntry. A nil message without an error is taken
	// as an undecodable entry.
	Unmarshal(fields map[string]any) (*message.Message, error)
}

// decodeEntry runs u on an entry's fields and sets the keys that tell where
// the message came from (from's stream, entry id, group and consumer; the
// last two empty in fan-out), replacing any published under those names. An
// Unmarshaler that returns neither a message nor an error, or that panics,
// has the entry treated as undecodable rather than crashing the
// subscription or the process.
func decodeEntry(u Unmarshaler, fields map[string]any, from origin) (msg *message.Message, err error) {
	defer func() {
		if p := recover(); p != nil {
			msg, err = nil, fmt.Errorf("%w: the Unmarshaler (%T) panicked: %v", ErrInvalidEntry, u, p)
		}
	}()
	if r, ok := u.(replyUnmarshaler); ok {
		msg, err = r.unmarshalReply(fields)
	} else {
		msg, err = u.Unmarshal(fields)
	}
	switch {
	case err != nil:
		return nil, err
	case msg == nil:
		return nil, fmt.Errorf("%w: the Unmarshaler (%T) returned no message and no error", ErrInvalidEntry, u)
	case msg.Metadata == nil:
		msg.Metadata = make(message.Metadata)
	}
	msg.Metadata.Set(MetadataStream, from.stream)
	msg.Metadata.Set(MetadataEntryID, from.entryID)
	msg.Metadata.Set(MetadataGroup, from.group)
	msg.Metadata.Set(MetadataConsumer, from.consumer)
	return msg, nil
}

// origin is where a message came from: its stream, entry id, group and
// consumer go under the Metadata* keys on delivery (see decodeEntry), and all
// of it under the MetadataOriginal* keys of a dead letter.
type origin struct {
	topic, stream, entryID, group, consumer, deliveryCount string
}

// deliveryOrigin reads the origin of a delivered message from the metadata the
// Subscriber set and, for the topic, from the router's context ctx.
func deliveryOrigin(ctx context.Context, msg *message.Message) origin {
	return origin{
		topic:         message.SubscribeTopicFromCtx(ctx),
		stream:        msg.Metadata.Get(MetadataStream),
		entryID:       msg.Metadata.Get(MetadataEntryID),
		group:         msg.Metadata.Get(MetadataGroup),
		consumer:      msg.Metadata.Get(MetadataConsumer),
		deliveryCount: msg.Metadata.Get(MetadataDeliveryCount),
	}
}

// stamp writes o and cause under the dead-letter keys of md, replacing what
// those keys held.
func (o origin) stamp(md message.Metadata, cause string) {
	md[MetadataError] = cause
	md[MetadataOriginalTopic] = o.topic
	md[MetadataOriginalStream] = o.stream
	md[MetadataOriginalEntryID] = o.entryID
	md[MetadataOriginalGroup] = o.group
	md[MetadataOriginalConsumer] = o.consumer
	md[MetadataOriginalDeliveryCount] = o.deliveryCount
}

// DefaultMarshaler writes the UUID and the payload under [FieldUUID] and
// [FieldPayload], and each metadata key as a field of its own, in key order.
// Metadata keys equal to a reserved field are rejected.
type DefaultMarshaler struct{}

// Marshal implements [Marshaler].
func (DefaultMarshaler) Marshal(_ string, msg *message.Message) ([]any, error) {
	if msg.UUID == "" {
		return nil, fmt.Errorf("%w: the UUID is empty: it is the key consumers deduplicate on", ErrInvalidMessage)
	}
	fields := make([]any, 0, 4+2*len(msg.Metadata))
	fields = append(fields, FieldUUID, msg.UUID, FieldPayload, []byte(msg.Payload))
	if len(msg.Metadata) == 0 {
		return fields, nil
	}
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		if k == FieldUUID || k == FieldPayload {
			return nil, fmt.Errorf("%w: message %s has metadata key %q, which is a reserved entry field; rename it",
				ErrInvalidMessage, msg.UUID, k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fields = append(fields, k, msg.Metadata[k])
	}
	return fields, nil
}

// Unmarshal implements [Unmarshaler]. An entry without a non-empty
// [FieldUUID] or without [FieldPayload] is invalid. An entry written by
// watermill-redisstream (see [RedisstreamMarshaler]) decodes to the message
// its Subscriber would deliver, with the same UUID and metadata.
func (DefaultMarshaler) Unmarshal(fields map[string]any) (*message.Message, error) {
	return unmarshalDefault(fields, false)
}

// replyUnmarshaler is an Unmarshaler that can take over the values of a
// go-redis reply instead of copying them; decodeEntry, which is only given
// replies' fields, prefers it.
type replyUnmarshaler interface {
	unmarshalReply(fields map[string]any) (*message.Message, error)
}

var _ replyUnmarshaler = DefaultMarshaler{}

func (DefaultMarshaler) unmarshalReply(fields map[string]any) (*message.Message, error) {
	return unmarshalDefault(fields, true)
}

// unmarshalDefault is DefaultMarshaler.Unmarshal. With fromReply, fields
// are values of a go-redis reply, whose strings each lie over a buffer of
// their own that nothing else holds (go-redis reads a bulk string into a
// new []byte and hands it over as a string without copying): the payload
// then takes that buffer instead of a copy of it, so a large message is
// not held twice on its way in. Fields from anywhere else (the exported
// Unmarshal) are copied: a string may lie in memory that must not be
// written, and a handler may write its payload.
func unmarshalDefault(fields map[string]any, fromReply bool) (*message.Message, error) {
	if isRedisstreamEntry(fields) {
		return unmarshalRedisstream(fields)
	}
	uuid, ok := fields[FieldUUID].(string)
	if !ok || uuid == "" {
		return nil, fmt.Errorf("%w: no %q field", ErrInvalidEntry, FieldUUID)
	}
	payload, ok := fields[FieldPayload].(string)
	if !ok {
		return nil, fmt.Errorf("%w: entry of message %s has no %q field", ErrInvalidEntry, uuid, FieldPayload)
	}
	var body []byte
	if fromReply {
		body = unsafe.Slice(unsafe.StringData(payload), len(payload))
	} else {
		body = []byte(payload)
	}
	msg := message.NewMessage(uuid, body)
	for k, v := range fields {
		if k == FieldUUID || k == FieldPayload {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%w: entry of message %s has field %q of type %T, want a string", ErrInvalidEntry, uuid, k, v)
		}
		msg.Metadata[k] = s
	}
	return msg, nil
}
