package compat

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack"

	"github.com/echomq/valkeystream"
)

// metadataField returns the metadata field RedisstreamMarshaler writes for msg.
func metadataField(t *testing.T, msg *message.Message) []byte {
	t.Helper()
	values, err := valkeystream.RedisstreamMarshaler{}.Marshal("topic", msg)
	require.NoError(t, err)
	for i := 0; i+1 < len(values); i += 2 {
		if values[i] == "metadata" {
			return values[i+1].([]byte)
		}
	}
	t.Fatalf("RedisstreamMarshaler wrote no metadata field: %q", values)
	return nil
}

// TestMetadataEncodingIsTheIncumbents: RedisstreamMarshaler encodes
// metadata byte for byte as the MessagePack library of watermill-redisstream
// does with sorted keys (watermill-redisstream itself writes the keys in Go's
// map order, which the decoders do not care about).
func TestMetadataEncodingIsTheIncumbents(t *testing.T) {
	for i, msg := range testMessages(200, 6) {
		if len(msg.Metadata) == 0 {
			continue
		}
		var want bytes.Buffer
		require.NoError(t, msgpack.NewEncoder(&want).SortMapKeys(true).Encode(msg.Metadata))
		got := metadataField(t, msg)
		require.True(t, bytes.Equal(want.Bytes(), got), "message %d: got % x, want % x", i, got[:min(len(got), 64)], want.Bytes()[:min(want.Len(), 64)])
	}
}

// FuzzAgainstIncumbent decodes entries of watermill-redisstream's layout with
// both libraries: whatever valkeystream decodes, watermill-redisstream
// decodes to the same message. valkeystream refuses more (an empty UUID,
// bytes after the metadata map, a key twice), and such entries are
// dead-lettered, not lost.
func FuzzAgainstIncumbent(f *testing.F) {
	for _, msg := range testMessages(40, 7) {
		values, err := redisstream.DefaultMarshallerUnmarshaller{}.Marshal("topic", msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(values["_watermill_message_uuid"].(string), string(values["payload"].([]byte)), values["metadata"].([]byte))
	}
	f.Add("", "p", []byte{})
	f.Add("id", "p", []byte("\x81\xa1a\xa1b\x00"))
	f.Add("id", "p", []byte("\x82\xa1a\xa1b\xa1a\xa1c"))
	f.Add("id", "p", []byte("\xd4\x01\x00\x80"))
	f.Add("id", "p", []byte("\xc0"))
	f.Fuzz(func(t *testing.T, uuid, payload string, metadata []byte) {
		fields := map[string]any{"_watermill_message_uuid": uuid, "payload": payload, "metadata": string(metadata)}
		got, err := valkeystream.DefaultMarshaler{}.Unmarshal(fields)
		if err != nil {
			return
		}
		want, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(fields)
		if err != nil {
			t.Fatalf("valkeystream decoded %q %q %q, watermill-redisstream refuses: %v", got.UUID, got.Payload, got.Metadata, err)
		}
		if got.UUID != want.UUID || !bytes.Equal(got.Payload, want.Payload) || !maps.Equal(got.Metadata, want.Metadata) {
			t.Fatalf("valkeystream decoded %q %q %q, watermill-redisstream %q %q %q",
				got.UUID, got.Payload, got.Metadata, want.UUID, want.Payload, want.Metadata)
		}
	})
}

// seedMessages are the messages of the seed corpus of the library's
// FuzzRedisstreamUnmarshal, by file name.
func seedMessages() map[string]*message.Message {
	md := func(msg *message.Message, kv ...string) *message.Message {
		for i := 0; i+1 < len(kv); i += 2 {
			msg.Metadata.Set(kv[i], kv[i+1])
		}
		return msg
	}
	many := message.NewMessage("7f1e0f0c-5d8c-4b2f-9a59-5f2d7f3c0a17", []byte(`{"order":17}`))
	for i := range 17 {
		many.Metadata.Set(fmt.Sprint("k", i), fmt.Sprint(i))
	}
	return map[string]*message.Message{
		"incumbent-plain":           message.NewMessage("0b5d3f4e-8a1c-4c7e-9a4b-2f1d6e8c9a01", []byte(`{"order":1}`)),
		"incumbent-empty-payload":   message.NewMessage("1c6e4a5f-9b2d-4d8f-8b5c-3a2e7f9d0b12", nil),
		"incumbent-binary-payload":  message.NewMessage("2d7f5b6a-0c3e-4e9a-9c6d-4b3f8a0e1c23", []byte("\x00\xff\xfe\x01\x80")),
		"incumbent-metadata":        md(message.NewMessage("3e8a6c7b-1d4f-4fab-8d7e-5c4a9b1f2d34", []byte("x")), "trace_id", "abc123"),
		"incumbent-long-metadata":   md(message.NewMessage("4f9b7d8c-2e5a-4abc-9e8f-6d5bac2a3e45", nil), strings.Repeat("k", 40), strings.Repeat("v", 300)),
		"incumbent-binary-metadata": md(message.NewMessage("5a0c8e9d-3f6b-4bcd-8f9a-7e6cbd3b4f56", []byte("y")), "bin", "\xff\x00\xfe", "", "empty key"),
		"incumbent-map16-metadata":  many,
	}
}

const seedDir = "../testdata/fuzz/FuzzRedisstreamUnmarshal"

// TestSeedCorpusWasWrittenByTheIncumbent checks the library's seeds named
// incumbent-*: each is an entry as watermill-redisstream's Publisher stored
// it on the server, and its Unmarshaller reads it as the seed's message.
// VALKEYSTREAM_UPDATE_SEEDS=1 writes them again from a real Publisher.
func TestSeedCorpusWasWrittenByTheIncumbent(t *testing.T) {
	seeds := seedMessages()
	if os.Getenv("VALKEYSTREAM_UPDATE_SEEDS") == "1" {
		writeSeeds(t, seeds)
	}
	for name, want := range seeds {
		uuid, payload, metadata, shape := readSeed(t, filepath.Join(seedDir, name))
		require.Equal(t, 3, shape, "seed %s: the payload and metadata fields are present", name)
		got, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(map[string]any{
			"_watermill_message_uuid": uuid, "payload": payload, "metadata": string(metadata)})
		require.NoError(t, err, "seed %s", name)
		requireSameMessage(t, want, got, "seed "+name)
	}
}

// writeSeeds publishes seeds with watermill-redisstream and stores each
// entry, as the server returns it, as a seed of FuzzRedisstreamUnmarshal.
func writeSeeds(t *testing.T, seeds map[string]*message.Message) {
	topic := topicName()
	pub := newIncumbentPublisher(t)
	for name, msg := range seeds {
		require.NoError(t, pub.Publish(topic, msg))
		stored := entries(t, newClient(t), topic)
		last := stored[len(stored)-1].Values
		require.Len(t, last, 3, "seed %s: fields %q", name, last)
		body := fmt.Sprintf("go test fuzz v1\nstring(%s)\nstring(%s)\n[]byte(%s)\nint(3)\n",
			strconv.Quote(last["_watermill_message_uuid"].(string)),
			strconv.Quote(last["payload"].(string)),
			strconv.Quote(last["metadata"].(string)))
		require.NoError(t, os.WriteFile(filepath.Join(seedDir, name), []byte(body), 0o644))
	}
	_ = newClient(t).Del(context.Background(), topic)
}

// readSeed parses a seed file of FuzzRedisstreamUnmarshal.
func readSeed(t *testing.T, path string) (uuid, payload string, metadata []byte, shape int) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err, "run with VALKEYSTREAM_UPDATE_SEEDS=1 to write the seeds")
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 5, "seed %s", path)
	require.Equal(t, "go test fuzz v1", lines[0])
	arg := func(line, prefix string) string {
		require.True(t, strings.HasPrefix(line, prefix+"(") && strings.HasSuffix(line, ")"), "seed %s: line %q", path, line)
		s, err := strconv.Unquote(line[len(prefix)+1 : len(line)-1])
		require.NoError(t, err, "seed %s: line %q", path, line)
		return s
	}
	shape, err = strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(lines[4], "int("), ")"))
	require.NoError(t, err, "seed %s: line %q", path, lines[4])
	return arg(lines[1], "string"), arg(lines[2], "string"), []byte(arg(lines[3], "[]byte")), shape
}
