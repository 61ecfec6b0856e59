package valkeystream

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Entry fields of the layout that watermill-redisstream (v1.4.x, its
// DefaultMarshallerUnmarshaller) writes: the UUID, the payload, and the
// metadata as one MessagePack map of strings (see msgpack.go), empty when
// the message has none.
const (
	redisstreamFieldUUID     = "_watermill_message_uuid"
	redisstreamFieldPayload  = "payload"
	redisstreamFieldMetadata = "metadata"
)

// RedisstreamMarshaler writes entries in the layout of watermill-redisstream
// v1.4.x, so that its Subscribers read them, and reads both that layout and
// the one of [DefaultMarshaler] (it decodes exactly as DefaultMarshaler
// does).
//
// Use it as PublisherConfig.Marshaler while a rolling migration still runs
// Subscribers of watermill-redisstream on a topic: they fail on entries in
// the layout of DefaultMarshaler and end their subscription. Switch it off
// (back to DefaultMarshaler) once no Subscriber of watermill-redisstream
// reads the topic any more and none will be started again by a rollback; a
// valkeystream Subscriber reads the entries of both layouts either way. See
// docs/migration.md.
//
// An entry holds the fields "_watermill_message_uuid" (the UUID), "payload"
// and "metadata" (every metadata key and value as one MessagePack map, keys
// in increasing order; empty when there is no metadata). Unlike
// DefaultMarshaler's layout, metadata may use the keys "uuid" and "payload",
// and `XRANGE` shows metadata as MessagePack bytes.
type RedisstreamMarshaler struct{}

// Marshal implements [Marshaler]. The UUID must not be empty.
func (RedisstreamMarshaler) Marshal(_ string, msg *message.Message) ([]any, error) {
	if msg.UUID == "" {
		return nil, fmt.Errorf("%w: the UUID is empty: it is the key consumers deduplicate on", ErrInvalidMessage)
	}
	md := []byte{}
	if len(msg.Metadata) > 0 {
		var err error
		if md, err = appendMsgpackStrings(nil, msg.Metadata); err != nil {
			return nil, fmt.Errorf("%w: message %s: encoding its metadata: %v", ErrInvalidMessage, msg.UUID, err)
		}
	}
	return []any{
		redisstreamFieldUUID, msg.UUID,
		redisstreamFieldPayload, []byte(msg.Payload),
		redisstreamFieldMetadata, md,
	}, nil
}

// Unmarshal implements [Unmarshaler]: it reads entries of either layout, as
// [DefaultMarshaler.Unmarshal] does.
func (RedisstreamMarshaler) Unmarshal(fields map[string]any) (*message.Message, error) {
	return DefaultMarshaler{}.Unmarshal(fields)
}

// isRedisstreamEntry reports whether fields are laid out by
// watermill-redisstream: they hold its UUID field and not the one of
// [DefaultMarshaler], which every entry of that layout holds and which
// watermill-redisstream never writes.
func isRedisstreamEntry(fields map[string]any) bool {
	_, theirs := fields[redisstreamFieldUUID]
	_, ours := fields[FieldUUID]
	return theirs && !ours
}

// unmarshalRedisstream decodes an entry of watermill-redisstream's layout
// into the message its Subscriber would deliver: the same UUID, payload and
// metadata. Like that Subscriber, it takes a missing payload or metadata
// field as empty. It is stricter where the entry cannot be one that
// watermill-redisstream wrote, rather than drop data: an empty UUID, a field
// of another name, a value that is not a string, or metadata that is not
// exactly one MessagePack map of strings make the entry invalid.
func unmarshalRedisstream(fields map[string]any) (*message.Message, error) {
	uuid, ok := fields[redisstreamFieldUUID].(string)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: entry in watermill-redisstream's layout has field %q of type %T, want a string",
			ErrInvalidEntry, redisstreamFieldUUID, fields[redisstreamFieldUUID])
	case uuid == "":
		return nil, fmt.Errorf("%w: entry in watermill-redisstream's layout has an empty %q field: the UUID is the key consumers deduplicate on",
			ErrInvalidEntry, redisstreamFieldUUID)
	}
	var payload, md string
	for k, v := range fields {
		s, ok := v.(string)
		switch {
		case k != redisstreamFieldUUID && k != redisstreamFieldPayload && k != redisstreamFieldMetadata:
			return nil, fmt.Errorf("%w: entry of message %s in watermill-redisstream's layout has field %q, which that layout does not have",
				ErrInvalidEntry, uuid, k)
		case !ok:
			return nil, fmt.Errorf("%w: entry of message %s has field %q of type %T, want a string", ErrInvalidEntry, uuid, k, v)
		case k == redisstreamFieldPayload:
			payload = s
		case k == redisstreamFieldMetadata:
			md = s
		}
	}
	// One copy of the payload, as in DefaultMarshaler.Unmarshal.
	msg := message.NewMessage(uuid, message.Payload(payload))
	if md == "" {
		return msg, nil
	}
	metadata, err := decodeMsgpackStrings(md)
	if err != nil {
		return nil, fmt.Errorf("%w: entry of message %s in watermill-redisstream's layout: field %q is not a MessagePack map of strings: %v",
			ErrInvalidEntry, uuid, redisstreamFieldMetadata, err)
	}
	msg.Metadata = metadata
	return msg, nil
}

// storedUUID returns the UUID an entry's publisher stored in it, in either
// layout, as text, or "" if it holds none.
func storedUUID(fields map[string]any) string {
	if uuid := fieldText(fields[FieldUUID]); uuid != "" {
		return uuid
	}
	return fieldText(fields[redisstreamFieldUUID])
}
