package valkeystream

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A payload read from the server is not copied on its way to the handler;
// one given to the exported Unmarshal is, since its string may lie in
// memory that must not be written.
func TestPayloadOfAReplyIsNotCopied(t *testing.T) {
	payload := string([]byte("a payload of some size")) // over a buffer of its own, as go-redis hands it over
	fields := map[string]any{FieldUUID: "u1", FieldPayload: payload}

	msg, err := decodeEntry(DefaultMarshaler{}, fields, origin{stream: "s", entryID: "1-0"})
	require.NoError(t, err)
	assert.Equal(t, payload, string(msg.Payload))
	assert.Same(t, unsafe.StringData(payload), &msg.Payload[0], "decoding a reply copied the payload")

	msg, err = decodeEntry(&DefaultMarshaler{}, fields, origin{stream: "s", entryID: "1-0"})
	require.NoError(t, err)
	assert.Same(t, unsafe.StringData(payload), &msg.Payload[0], "a *DefaultMarshaler copied the payload")

	msg, err = DefaultMarshaler{}.Unmarshal(fields)
	require.NoError(t, err)
	assert.Equal(t, payload, string(msg.Payload))
	assert.NotSame(t, unsafe.StringData(payload), &msg.Payload[0], "the exported Unmarshal must copy the payload")

	msg, err = DefaultMarshaler{}.Unmarshal(map[string]any{FieldUUID: "u2", FieldPayload: ""})
	require.NoError(t, err)
	assert.Empty(t, msg.Payload)
	msg, err = decodeEntry(DefaultMarshaler{}, map[string]any{FieldUUID: "u3", FieldPayload: ""}, origin{})
	require.NoError(t, err)
	assert.Empty(t, msg.Payload)
}
