package valkeystream

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The fuzz targets derive an entry's field map from fuzz input: the first
// byte of data is a separator, and the rest, split on it, alternates field
// names and values (a trailing name without a value is dropped, and a later
// duplicate name replaces an earlier one). kinds picks each value's Go type,
// two bits per field in order: a string (what the server answers), []byte,
// an int64 (its length), or nil. A seed corpus lives in testdata/fuzz and runs
// with every `go test`; explore with
//
//	go test -run '^$' -fuzz FuzzUnmarshal -fuzztime 60s .
//	go test -run '^$' -fuzz FuzzDeadLetterRecord -fuzztime 60s .

// fuzzFields returns the field map derived from data and kinds, and each
// field's value as text, as the server would store it.
func fuzzFields(data []byte, kinds uint64) (map[string]any, map[string]string) {
	fields, text := map[string]any{}, map[string]string{}
	if len(data) == 0 {
		return fields, text
	}
	parts := bytes.Split(data[1:], data[:1])
	for i := 0; i+1 < len(parts); i += 2 {
		name, value := string(parts[i]), string(parts[i+1])
		switch kinds >> (i % 64) & 3 {
		case 0:
			fields[name], text[name] = value, value
		case 1:
			fields[name], text[name] = []byte(value), value
		case 2:
			fields[name], text[name] = int64(len(value)), strconv.Itoa(len(value))
		case 3:
			fields[name], text[name] = nil, ""
		}
	}
	return fields, text
}

// fuzzData joins parts into fuzz data with the separator sep.
func fuzzData(sep byte, parts ...string) []byte {
	return append([]byte{sep}, strings.Join(parts, string(sep))...)
}

// asServer returns the fields that XADD with values stores, as the server
// answers them: every value a string.
func asServer(t *testing.T, values []any) map[string]any {
	t.Helper()
	if len(values)%2 != 0 {
		t.Fatalf("Marshal returned %d elements, want field-value pairs", len(values))
	}
	fields := make(map[string]any, len(values)/2)
	for i := 0; i < len(values); i += 2 {
		name, ok := values[i].(string)
		if !ok {
			t.Fatalf("field name %v is a %T, want a string", values[i], values[i])
		}
		if _, dup := fields[name]; dup {
			t.Fatalf("Marshal wrote field %q twice", name)
		}
		switch v := values[i+1].(type) {
		case string:
			fields[name] = v
		case []byte:
			fields[name] = string(v)
		default:
			t.Fatalf("field %q has a value of type %T", name, v)
		}
	}
	return fields
}

func sameMessage(a, b *message.Message) bool {
	if a.UUID != b.UUID || !bytes.Equal(a.Payload, b.Payload) || len(a.Metadata) != len(b.Metadata) {
		return false
	}
	for k, v := range a.Metadata {
		if w, ok := b.Metadata[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// addCommonSeeds adds the seeds both targets start from.
func addCommonSeeds(add func(data []byte, kinds uint64)) {
	// A valid entry.
	add(fuzzData(0, "uuid", "id-1", "payload", "p", "trace", "abc"), 0)
	// No uuid, an empty uuid.
	add(fuzzData(0, "payload", "p", "k", "v"), 0)
	add(fuzzData(0, "uuid", "", "payload", "p"), 0)
	// An empty payload, no payload.
	add(fuzzData(0, "uuid", "id-1", "payload", ""), 0)
	add(fuzzData(0, "uuid", "id-1"), 0)
	// Metadata named like the keys a Subscriber and a dead letter set.
	add(fuzzData(0, "uuid", "id-1", "payload", "p", MetadataDeliveryCount, "7", MetadataEntryID, "9-9",
		MetadataError, "old", MetadataOriginalTopic, "elsewhere"), 0)
	// Binary bytes and invalid UTF-8 in names and values.
	add(fuzzData(1, "uuid", "\xff\xfe\x00", "payload", "\x00\x01\xff", "\x00\xc3\x28", "\xed\xa0\x80"), 0)
	// Values of other types: []byte, int64, nil; a []byte payload.
	add(fuzzData(0, "uuid", "id-1", "payload", "p", "a", "x", "b", "y", "c", "z"), 1<<4|2<<6|3<<8)
	add(fuzzData(0, "uuid", "id-1", "payload", "p"), 1<<2)
	// A duplicate name, a dangling name, an empty name, no fields.
	add(fuzzData(0, "uuid", "a", "uuid", "b", "payload", "p", "dangling"), 0)
	add(fuzzData(0, "", "", "uuid", "id-1", "payload", "p"), 0)
	add(nil, 0)
}

func FuzzUnmarshal(f *testing.F) {
	addCommonSeeds(func(data []byte, kinds uint64) { f.Add(data, kinds) })
	f.Fuzz(func(t *testing.T, data []byte, kinds uint64) {
		fields, text := fuzzFields(data, kinds)
		msg, err := DefaultMarshaler{}.Unmarshal(fields)
		if err != nil {
			if !errors.Is(err, ErrInvalidEntry) {
				t.Fatalf("Unmarshal error %q does not wrap ErrInvalidEntry", err)
			}
			return
		}
		if isRedisstreamEntry(fields) {
			return // the other layout: FuzzRedisstreamUnmarshal checks it
		}
		// Decoding keeps every field: the UUID, the payload, the rest as
		// metadata.
		if msg.UUID == "" || msg.UUID != text[FieldUUID] || string(msg.Payload) != text[FieldPayload] {
			t.Fatalf("decoded uuid %q payload %q from fields %q", msg.UUID, msg.Payload, text)
		}
		if len(msg.Metadata) != len(fields)-2 {
			t.Fatalf("decoded %d metadata keys from %d fields", len(msg.Metadata), len(fields))
		}
		for k, v := range msg.Metadata {
			if text[k] != v {
				t.Fatalf("metadata %q is %q, field was %q", k, v, text[k])
			}
		}
		// And a decoded message survives a round trip.
		values, err := DefaultMarshaler{}.Marshal("topic", msg)
		if err != nil {
			t.Fatalf("Marshal of a decoded message: %v", err)
		}
		again, err := DefaultMarshaler{}.Unmarshal(asServer(t, values))
		if err != nil {
			t.Fatalf("Unmarshal after the round trip: %v", err)
		}
		if !sameMessage(msg, again) {
			t.Fatalf("round trip changed the message: %q %q %v, then %q %q %v",
				msg.UUID, msg.Payload, msg.Metadata, again.UUID, again.Payload, again.Metadata)
		}
	})
}

func FuzzDeadLetterRecord(f *testing.F) {
	addCommonSeeds(func(data []byte, kinds uint64) {
		f.Add(data, kinds, "1700000000000-0", "valkeystream: invalid entry: boom")
	})
	f.Add(fuzzData(0, "foo", "bar"), uint64(0), "", "")
	f.Fuzz(func(t *testing.T, data []byte, kinds uint64, entryID, cause string) {
		fields, text := fuzzFields(data, kinds)
		o := origin{topic: "orders", stream: "app:orders", entryID: entryID, group: "g", consumer: "c", deliveryCount: "2"}
		record := invalidEntryRecord(fields, o, errors.New(cause))
		values, err := DefaultMarshaler{}.Marshal("orders.dead", record)
		if err != nil {
			t.Fatalf("Marshal of a dead letter: %v", err)
		}
		got, err := DefaultMarshaler{}.Unmarshal(asServer(t, values))
		if err != nil {
			t.Fatalf("a dead letter does not decode: %v (fields %q)", err, text)
		}

		wantUUID := text[FieldUUID]
		if wantUUID == "" {
			wantUUID = text[redisstreamFieldUUID]
		}
		if wantUUID == "" {
			wantUUID = entryUUID(o.stream, entryID)
		}
		if got.UUID != wantUUID || string(got.Payload) != text[FieldPayload] {
			t.Fatalf("dead letter uuid %q payload %q, want %q %q", got.UUID, got.Payload, wantUUID, text[FieldPayload])
		}
		stamped := map[string]string{
			MetadataError:                 cause,
			MetadataOriginalTopic:         o.topic,
			MetadataOriginalStream:        o.stream,
			MetadataOriginalEntryID:       o.entryID,
			MetadataOriginalGroup:         o.group,
			MetadataOriginalConsumer:      o.consumer,
			MetadataOriginalDeliveryCount: o.deliveryCount,
		}
		for k, want := range stamped {
			if got.Metadata[k] != want {
				t.Fatalf("dead letter metadata %q is %q, want %q", k, got.Metadata[k], want)
			}
		}
		for k, v := range text {
			if k == FieldUUID || k == FieldPayload {
				continue
			}
			if _, ok := stamped[k]; ok {
				continue // the origin is stamped over a raw field of that name
			}
			if w, ok := got.Metadata[k]; !ok || w != v {
				t.Fatalf("raw field %q (%q) is %q in the dead letter", k, v, w)
			}
		}
		if len(got.Metadata) > len(text)+len(stamped) {
			t.Fatalf("dead letter has %d metadata keys, more than the %d raw fields and %d stamped keys",
				len(got.Metadata), len(text), len(stamped))
		}
	})
}

func TestFuzzFieldsDerivation(t *testing.T) {
	fields, text := fuzzFields(fuzzData('|', "uuid", "u", "n", "abc", "b", "x", "z", "y", "dangling"), 2<<2|1<<4|3<<6)
	want := map[string]any{"uuid": "u", "n": int64(3), "b": []byte("x"), "z": nil}
	if fmt.Sprint(fields) != fmt.Sprint(want) {
		t.Fatalf("fields %v, want %v", fields, want)
	}
	if text["n"] != "3" || text["b"] != "x" || text["z"] != "" {
		t.Fatalf("text %q", text)
	}
}
