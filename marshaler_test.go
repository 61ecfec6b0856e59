package valkeystream_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
)

func TestDefaultMarshalerLayout(t *testing.T) {
	msg := message.NewMessage("id-1", []byte("payload"))
	msg.Metadata.Set("b", "2")
	msg.Metadata.Set("a", "1")
	fields, err := valkeystream.DefaultMarshaler{}.Marshal("topic", msg)
	require.NoError(t, err)
	assert.Equal(t, []any{"uuid", "id-1", "payload", []byte("payload"), "a", "1", "b", "2"}, fields,
		"the UUID and payload first, then each metadata key as its own field, in key order")
}

func TestDefaultMarshalerRejects(t *testing.T) {
	tests := []struct {
		name string
		msg  *message.Message
		want string
	}{
		{name: "empty uuid", msg: message.NewMessage("", nil), want: "UUID is empty"},
		{name: "reserved uuid key", msg: withMetadata(message.NewMessage("x", nil), "uuid", "y"), want: `metadata key "uuid"`},
		{name: "reserved payload key", msg: withMetadata(message.NewMessage("x", nil), "payload", "y"), want: `metadata key "payload"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := valkeystream.DefaultMarshaler{}.Marshal("topic", tt.msg)
			assert.ErrorIs(t, err, valkeystream.ErrInvalidMessage)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func withMetadata(m *message.Message, k, v string) *message.Message {
	m.Metadata.Set(k, v)
	return m
}

func TestDefaultMarshalerUnmarshal(t *testing.T) {
	msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(map[string]any{"uuid": "id-1", "payload": "p", "k": "v"})
	require.NoError(t, err)
	assert.Equal(t, "id-1", msg.UUID)
	assert.Equal(t, "p", string(msg.Payload))
	assert.Equal(t, message.Metadata{"k": "v"}, msg.Metadata)

	for name, fields := range map[string]map[string]any{
		"no uuid":          {"payload": "p"},
		"empty uuid":       {"uuid": "", "payload": "p"},
		"no payload":       {"uuid": "x"},
		"non-string value": {"uuid": "x", "payload": "p", "k": 1},
		"nil":              nil,
	} {
		_, err := valkeystream.DefaultMarshaler{}.Unmarshal(fields)
		assert.ErrorIs(t, err, valkeystream.ErrInvalidEntry, name)
	}
}

func TestDeliveryCount(t *testing.T) {
	msg := message.NewMessage("x", nil)
	assert.Equal(t, 0, valkeystream.DeliveryCount(msg), "no metadata")
	msg.Metadata.Set(valkeystream.MetadataDeliveryCount, "3")
	assert.Equal(t, 3, valkeystream.DeliveryCount(msg))
	msg.Metadata.Set(valkeystream.MetadataDeliveryCount, "three")
	assert.Equal(t, 0, valkeystream.DeliveryCount(msg))
}
