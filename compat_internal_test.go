package valkeystream

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The entries below are laid out as watermill-redisstream v1.4.x writes them;
// the compat module checks such entries against its real code, and its
// seeds in testdata/fuzz/FuzzRedisstreamUnmarshal were written by it.

func TestRedisstreamUnmarshal(t *testing.T) {
	tests := []struct {
		name   string
		fields map[string]any
		want   *message.Message
	}{
		{
			name:   "with metadata",
			fields: map[string]any{"_watermill_message_uuid": "id-1", "payload": "hello", "metadata": "\x82\xa1a\xa11\xa5trace\xa3abc"},
			want:   withMetadata(message.NewMessage("id-1", []byte("hello")), "a", "1", "trace", "abc"),
		},
		{
			name:   "no metadata (written as an empty field)",
			fields: map[string]any{"_watermill_message_uuid": "id-2", "payload": "p", "metadata": ""},
			want:   message.NewMessage("id-2", []byte("p")),
		},
		{
			name:   "empty payload, binary metadata values",
			fields: map[string]any{"_watermill_message_uuid": "id-3", "payload": "", "metadata": "\x81\xa1k\xa2\xff\x00"},
			want:   withMetadata(message.NewMessage("id-3", nil), "k", "\xff\x00"),
		},
		{
			name:   "binary payload",
			fields: map[string]any{"_watermill_message_uuid": "id-4", "payload": "\x00\xff\xfe", "metadata": ""},
			want:   message.NewMessage("id-4", []byte("\x00\xff\xfe")),
		},
		{
			name:   "payload and metadata missing, as its decoder allows",
			fields: map[string]any{"_watermill_message_uuid": "id-5"},
			want:   message.NewMessage("id-5", nil),
		},
		{
			name:   "metadata keys that are reserved in the other layout",
			fields: map[string]any{"_watermill_message_uuid": "id-6", "payload": "p", "metadata": "\x82\xa4uuid\xa1x\xa7payload\xa1y"},
			want:   withMetadata(message.NewMessage("id-6", []byte("p")), "uuid", "x", "payload", "y"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, u := range []Unmarshaler{DefaultMarshaler{}, RedisstreamMarshaler{}} {
				got, err := u.Unmarshal(tt.fields)
				if err != nil {
					t.Fatalf("%T: %v", u, err)
				}
				if !sameMessage(got, tt.want) {
					t.Fatalf("%T: got %q %q %q, want %q %q %q", u, got.UUID, got.Payload, got.Metadata, tt.want.UUID, tt.want.Payload, tt.want.Metadata)
				}
			}
		})
	}
}

func TestRedisstreamUnmarshalRejects(t *testing.T) {
	tests := []struct {
		name   string
		fields map[string]any
		want   string
	}{
		{name: "empty uuid", fields: map[string]any{"_watermill_message_uuid": "", "payload": "p"}, want: `an empty "_watermill_message_uuid" field`},
		{name: "uuid not a string", fields: map[string]any{"_watermill_message_uuid": []byte("x"), "payload": "p"}, want: `field "_watermill_message_uuid" of type []uint8, want a string`},
		{name: "another field", fields: map[string]any{"_watermill_message_uuid": "id", "payload": "p", "metadata": "", "extra": "x"}, want: `field "extra", which that layout does not have`},
		{name: "payload not a string", fields: map[string]any{"_watermill_message_uuid": "id", "payload": int64(3)}, want: `field "payload" of type int64`},
		{name: "metadata not a string", fields: map[string]any{"_watermill_message_uuid": "id", "metadata": nil}, want: `field "metadata" of type <nil>`},
		{name: "metadata not msgpack", fields: map[string]any{"_watermill_message_uuid": "id", "metadata": "trace=abc"}, want: `field "metadata" is not a MessagePack map of strings`},
		{name: "metadata truncated", fields: map[string]any{"_watermill_message_uuid": "id", "metadata": "\x81\xa1a"}, want: "the data ends at byte 3"},
		{name: "metadata with an integer", fields: map[string]any{"_watermill_message_uuid": "id", "metadata": "\x81\xa1a\x01"}, want: "type code 0x01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DefaultMarshaler{}.Unmarshal(tt.fields)
			if !errors.Is(err, ErrInvalidEntry) {
				t.Fatalf("got message %v and error %v, want an error wrapping ErrInvalidEntry", got, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestDefaultMarshalerChoosesTheLayoutByTheUUIDField(t *testing.T) {
	// An entry of this library's layout whose message had a metadata key
	// named like the other layout's UUID field is still of this layout.
	ours := map[string]any{"uuid": "id-1", "payload": "p", "_watermill_message_uuid": "x", "metadata": "m"}
	got, err := DefaultMarshaler{}.Unmarshal(ours)
	if err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	want := withMetadata(message.NewMessage("id-1", []byte("p")), "_watermill_message_uuid", "x", "metadata", "m")
	if !sameMessage(got, want) {
		t.Fatalf("got %q %q %q, want %q", got.UUID, got.Payload, got.Metadata, want.Metadata)
	}

	// An entry of neither layout fails as it always did.
	_, err = DefaultMarshaler{}.Unmarshal(map[string]any{"payload": "p", "metadata": ""})
	if !errors.Is(err, ErrInvalidEntry) || !strings.Contains(err.Error(), `no "uuid" field`) {
		t.Fatalf("error %v, want ErrInvalidEntry saying there is no uuid field", err)
	}
}

func TestRedisstreamMarshalerLayout(t *testing.T) {
	msg := withMetadata(message.NewMessage("id-1", []byte("hello")), "trace", "abc", "a", "1")
	got, err := RedisstreamMarshaler{}.Marshal("topic", msg)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	want := []any{"_watermill_message_uuid", "id-1", "payload", []byte("hello"), "metadata", []byte("\x82\xa1a\xa11\xa5trace\xa3abc")}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if fieldText(got[i]) != fieldText(want[i]) {
			t.Fatalf("element %d is %q, want %q (all: %q)", i, got[i], want[i], got)
		}
	}

	// No metadata: an empty field, as watermill-redisstream writes it.
	got, err = RedisstreamMarshaler{}.Marshal("topic", message.NewMessage("id-2", nil))
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	if md, ok := got[5].([]byte); !ok || len(md) != 0 {
		t.Fatalf("metadata of a message without any is %#v, want an empty []byte", got[5])
	}

	_, err = RedisstreamMarshaler{}.Marshal("topic", message.NewMessage("", nil))
	if !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("an empty UUID gives %v, want ErrInvalidMessage", err)
	}
}

func TestRedisstreamMarshalerRoundTrip(t *testing.T) {
	msgs := []*message.Message{
		message.NewMessage("a", nil),
		message.NewMessage("b", []byte("\x00\xff")),
		withMetadata(message.NewMessage("c", []byte("x")), "uuid", "reserved elsewhere", "", "empty key", strings.Repeat("k", 300), strings.Repeat("v", 70000)),
	}
	for _, msg := range msgs {
		values, err := RedisstreamMarshaler{}.Marshal("topic", msg)
		if err != nil {
			t.Fatalf("Marshal %s: %v", msg.UUID, err)
		}
		got, err := RedisstreamMarshaler{}.Unmarshal(asServer(t, values))
		if err != nil {
			t.Fatalf("Unmarshal %s: %v", msg.UUID, err)
		}
		if !sameMessage(got, msg) {
			t.Fatalf("round trip of %s gave %q %q", msg.UUID, got.Payload, got.Metadata)
		}
	}
}

func TestDeadLetterOfAnIncumbentEntryKeepsItsUUID(t *testing.T) {
	fields := map[string]any{"_watermill_message_uuid": "id-7", "payload": "p", "metadata": "\x81"}
	_, err := DefaultMarshaler{}.Unmarshal(fields)
	if !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("got %v, want ErrInvalidEntry", err)
	}
	record := invalidEntryRecord(fields, origin{stream: "s", entryID: "1-0"}, err)
	if record.UUID != "id-7" || string(record.Payload) != "p" || record.Metadata.Get("metadata") != "\x81" {
		t.Fatalf("dead letter %q %q %q, want the entry's UUID, payload and raw metadata", record.UUID, record.Payload, record.Metadata)
	}
}

func withMetadata(msg *message.Message, kv ...string) *message.Message {
	for i := 0; i+1 < len(kv); i += 2 {
		msg.Metadata.Set(kv[i], kv[i+1])
	}
	return msg
}

// Shapes of the entry that FuzzRedisstreamUnmarshal builds, bit by bit.
const (
	shapePayload     = 1 << iota // the payload field is present
	shapeMetadata                // the metadata field is present
	shapeExtraField              // a field the layout does not have is present
	shapeBytesValues             // payload and metadata are []byte, not strings
)

// FuzzRedisstreamUnmarshal decodes entries in watermill-redisstream's layout
// built from the input: it never panics, and it never loses an entry: either
// the entry decodes to the message it holds, which survives a round trip
// through both Marshalers, or it fails with ErrInvalidEntry, and its dead
// letter keeps its UUID, payload and raw fields. The seeds in
// testdata/fuzz/FuzzRedisstreamUnmarshal named "incumbent-*" are entries
// watermill-redisstream wrote (see compat/).
//
//	go test -run '^$' -fuzz FuzzRedisstreamUnmarshal -fuzztime 30s .
func FuzzRedisstreamUnmarshal(f *testing.F) {
	all := shapePayload | shapeMetadata
	f.Add("id-1", "hello", []byte("\x82\xa1a\xa11\xa5trace\xa3abc"), all)
	f.Add("id-2", "", []byte{}, all)
	f.Add("id-3", "p", []byte("\xde\x00\x01\xd9\x01k\xc4\x01v"), all)
	f.Add("id-4", "p", []byte("\x81\xa1a"), all)
	f.Add("id-5", "p", []byte("\x82\xa1a\xa11\xa1a\xa12"), all)
	f.Add("id-6", "p", []byte("\x80\x00"), all)
	f.Add("", "p", []byte{}, all)
	f.Add("id-7", "p", []byte{}, 0)
	f.Add("id-8", "p", []byte("\x80"), all|shapeExtraField)
	f.Add("id-9", "p", []byte("\x80"), all|shapeBytesValues)
	f.Fuzz(func(t *testing.T, uuid, payload string, metadata []byte, shape int) {
		fields := map[string]any{redisstreamFieldUUID: uuid}
		if shape&shapePayload != 0 {
			fields[redisstreamFieldPayload] = payload
		}
		if shape&shapeMetadata != 0 {
			fields[redisstreamFieldMetadata] = string(metadata)
		}
		if shape&shapeExtraField != 0 {
			fields["extra"] = "x"
		}
		if shape&shapeBytesValues != 0 {
			for _, k := range []string{redisstreamFieldPayload, redisstreamFieldMetadata} {
				if s, ok := fields[k].(string); ok {
					fields[k] = []byte(s)
				}
			}
		}

		msg, err := DefaultMarshaler{}.Unmarshal(fields)
		if err != nil {
			if !errors.Is(err, ErrInvalidEntry) {
				t.Fatalf("error %q does not wrap ErrInvalidEntry", err)
			}
			record := invalidEntryRecord(fields, origin{stream: "s", entryID: "1-0"}, err)
			values, err := DefaultMarshaler{}.Marshal("s.dead", record)
			if err != nil {
				t.Fatalf("Marshal of the dead letter: %v", err)
			}
			dead, err := DefaultMarshaler{}.Unmarshal(asServer(t, values))
			if err != nil {
				t.Fatalf("the dead letter does not decode: %v", err)
			}
			if uuid != "" && dead.UUID != uuid {
				t.Fatalf("dead letter UUID %q, want the entry's %q", dead.UUID, uuid)
			}
			if fieldText(fields[redisstreamFieldPayload]) != string(dead.Payload) {
				t.Fatalf("dead letter payload %q, want %q", dead.Payload, fields[redisstreamFieldPayload])
			}
			if md, ok := fields[redisstreamFieldMetadata]; ok && dead.Metadata.Get(redisstreamFieldMetadata) != fieldText(md) {
				t.Fatalf("dead letter keeps metadata %q, want the raw %q", dead.Metadata.Get(redisstreamFieldMetadata), md)
			}
			return
		}

		hasBytes := shape&shapeBytesValues != 0 && shape&(shapePayload|shapeMetadata) != 0
		if shape&shapeExtraField != 0 || hasBytes || uuid == "" {
			t.Fatalf("shape %b with uuid %q decoded, want it refused", shape, uuid)
		}
		if msg.UUID != uuid || string(msg.Payload) != fieldText(fields[redisstreamFieldPayload]) {
			t.Fatalf("decoded %q %q from %q", msg.UUID, msg.Payload, fields)
		}
		want := map[string]string{}
		if len(metadata) > 0 && shape&shapeMetadata != 0 {
			if want, err = decodeMsgpackStrings(string(metadata)); err != nil {
				t.Fatalf("the entry decoded, but its metadata does not: %v", err)
			}
		}
		if !maps.Equal(map[string]string(msg.Metadata), want) {
			t.Fatalf("metadata %q, want %q", msg.Metadata, want)
		}

		// The message survives a round trip through either Marshaler.
		for _, m := range []Marshaler{RedisstreamMarshaler{}, DefaultMarshaler{}} {
			values, err := m.Marshal("topic", msg)
			if err != nil {
				if _, ok := m.(DefaultMarshaler); ok && errors.Is(err, ErrInvalidMessage) {
					continue // metadata named uuid or payload: reserved in that layout
				}
				t.Fatalf("%T.Marshal: %v", m, err)
			}
			again, err := DefaultMarshaler{}.Unmarshal(asServer(t, values))
			if err != nil {
				t.Fatalf("Unmarshal after %T: %v", m, err)
			}
			if !sameMessage(msg, again) {
				t.Fatalf("round trip through %T changed %q %q %q into %q %q %q",
					m, msg.UUID, msg.Payload, msg.Metadata, again.UUID, again.Payload, again.Metadata)
			}
		}
	})
}
