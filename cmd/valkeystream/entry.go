package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

var entryCommand = &command{
	name:    "entry",
	args:    "<stream> <id>",
	summary: "show one entry decoded: UUID, metadata, payload",
	help: `Shows the entry <id> of <stream> decoded as valkeystream's DefaultMarshaler
wrote it: the message UUID, its metadata and the start of its payload
(--payload-bytes, -1 for all of it; quoted when it is not printable text).
An entry that does not decode is shown as its raw fields with the reason.`,
	nargs: [2]int{2, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		n := fs.Int("payload-bytes", 512, "show at most this many bytes of the payload (-1: all)")
		return func(ctx context.Context, e *env, args []string) error {
			return showEntry(ctx, e, args[0], args[1], *n)
		}
	},
}

type entryView struct {
	Stream       string            `json:"stream"`
	ID           string            `json:"id"`
	Time         string            `json:"time"`
	UUID         string            `json:"uuid,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Payload      string            `json:"payload"`
	PayloadBytes int               `json:"payload_bytes"`
	DecodeError  string            `json:"decode_error,omitempty"`
	Fields       map[string]string `json:"fields,omitempty"` // raw, when it does not decode
}

func showEntry(ctx context.Context, e *env, stream, id string, n int) error {
	msgs, err := e.client.XRange(ctx, stream, id, id).Result()
	if err != nil {
		if isBadID(err) {
			return usagef("%q is not a stream entry id (they look like 1700000000000-0)", id)
		}
		return e.serverErr(fmt.Sprintf("reading entry %s of stream %q", id, stream), err)
	}
	if len(msgs) == 0 {
		return fmt.Errorf("stream %q has no entry %s: it was never there, or was trimmed or deleted", stream, id)
	}
	v := entryView{Stream: stream, ID: msgs[0].ID, Time: timeText(idTime(msgs[0].ID))}
	msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(msgs[0].Values)
	if err != nil {
		v.DecodeError = err.Error()
		v.Fields = map[string]string{}
		for k, val := range msgs[0].Values {
			v.Fields[k] = fieldText(val)
		}
	} else {
		v.UUID, v.Metadata = msg.UUID, msg.Metadata
		v.Payload, v.PayloadBytes = string(msg.Payload), len(msg.Payload)
	}
	if n >= 0 && len(v.Payload) > n {
		v.Payload = v.Payload[:n]
	}
	if e.json {
		return e.printJSON(v)
	}
	t := e.table("FIELD", "VALUE")
	t.row("stream", stream)
	t.row("id", v.ID)
	t.row("time", v.Time)
	if v.DecodeError != "" {
		t.row("decode error", v.DecodeError)
		for _, k := range sortedKeys(v.Fields) {
			t.row("field "+k, preview(v.Fields[k], n))
		}
		return t.flush()
	}
	t.row("uuid", v.UUID)
	for _, k := range sortedKeys(v.Metadata) {
		t.row("metadata "+k, v.Metadata[k])
	}
	t.row("payload", preview(string(msg.Payload), n))
	t.row("payload bytes", strconv.Itoa(v.PayloadBytes))
	return t.flush()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func isBadID(err error) bool {
	return redis.HasErrorPrefix(err, "Invalid stream ID")
}
