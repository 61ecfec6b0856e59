package valkeystream

import (
	"errors"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInvalidEntryRecord(t *testing.T) {
	o := origin{topic: "orders", stream: "app:orders", entryID: "5-1", group: "g", consumer: "c", deliveryCount: "2"}
	cause := errors.New("valkeystream: invalid entry: no \"payload\" field")

	r := invalidEntryRecord(map[string]any{
		"uuid": "raw-1", "foo": "bar", "bin": []byte{0xff}, "n": int64(7), "none": nil,
		MetadataError: "stale", MetadataOriginalTopic: "elsewhere", MetadataDeliveryCount: "9",
	}, o, cause)
	assert.Equal(t, "raw-1", r.UUID)
	assert.Empty(t, r.Payload)
	for k, want := range map[string]string{
		"foo": "bar", "bin": "\xff", "n": "7", "none": "",
		MetadataError:                 cause.Error(),
		MetadataOriginalTopic:         "orders",
		MetadataOriginalStream:        "app:orders",
		MetadataOriginalEntryID:       "5-1",
		MetadataOriginalGroup:         "g",
		MetadataOriginalConsumer:      "c",
		MetadataOriginalDeliveryCount: "2",
		MetadataDeliveryCount:         "9", // a raw field; replaced on delivery
	} {
		v, ok := r.Metadata[k]
		assert.True(t, ok, "metadata %s missing", k)
		assert.Equal(t, want, v, "metadata %s", k)
	}
	assert.Len(t, r.Metadata, 12)

	noUUID := invalidEntryRecord(map[string]any{"payload": "p"}, o, cause)
	assert.Equal(t, entryUUID("app:orders", "5-1"), noUUID.UUID)
	assert.Equal(t, "p", string(noUUID.Payload))
	emptyUUID := invalidEntryRecord(map[string]any{"uuid": ""}, o, cause)
	assert.Equal(t, noUUID.UUID, emptyUUID.UUID, "an empty uuid is no uuid")

	values, err := DefaultMarshaler{}.Marshal("orders.dead", invalidEntryRecord(nil, o, cause))
	require.NoError(t, err, "even an entry without fields has a dead letter")
	assert.Equal(t, FieldUUID, values[0])
}

func TestEntryUUID(t *testing.T) {
	u := entryUUID("orders", "1700000000000-0")
	assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), u,
		"a version 5 UUID in the RFC 9562 variant")
	assert.Equal(t, u, entryUUID("orders", "1700000000000-0"), "the same entry always gets the same UUID")
	assert.NotEqual(t, u, entryUUID("orders", "1700000000000-1"))
	assert.NotEqual(t, u, entryUUID("payments", "1700000000000-0"))
	assert.NotEqual(t, entryUUID("ab", "c"), entryUUID("a", "bc"), "the key and the id must not run together")
}
