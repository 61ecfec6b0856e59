package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

var entryCommand = &command{
	name:    "entry",
	args:    "<topic-or-stream> <id>",
	summary: "show one entry decoded: UUID, metadata, payload",
	help: `Shows the entry <id> of <stream> decoded as valkeystream's DefaultMarshaler
wrote it: the message UUID, its metadata and the start of its payload
(--payload-bytes, -1 for all of it; quoted when it is not printable text).
An entry that does not decode is shown as its raw fields with the reason.
For each group that holds the entry pending: the consumer, how long it has
been idle and its delivery count.`,
	nargs: [2]int{2, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		n := fs.Int("payload-bytes", 512, "show at most this many bytes of the payload (-1: all)")
		return func(ctx context.Context, e *env, args []string) error {
			return showEntry(ctx, e, e.stream(args[0]).Key, args[1], *n)
		}
	},
}

type entryView struct {
	Stream       string            `json:"stream"`
	Topic        string            `json:"topic"`
	ID           string            `json:"id"`
	Time         string            `json:"time"`
	UUID         string            `json:"uuid,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Payload      string            `json:"payload"`
	PayloadBytes int               `json:"payload_bytes"`
	DecodeError  string            `json:"decode_error,omitempty"`
	Fields       map[string]string `json:"fields,omitempty"` // raw, when it does not decode
	PendingIn    []pendingIn       `json:"pending_in"`
}

// pendingIn is where an entry is pending.
type pendingIn struct {
	Group      string `json:"group"`
	Consumer   string `json:"consumer"`
	IdleMS     int64  `json:"idle_ms"`
	Deliveries int64  `json:"deliveries"`
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
		return fmt.Errorf("stream %s has no entry %s: it was never there, or was trimmed or deleted%s", e.named(stream), id, e.prefixHint())
	}
	v := entryView{Stream: stream, Topic: e.topicOf(stream), ID: msgs[0].ID, Time: timeText(idTime(msgs[0].ID))}
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
	if v.PendingIn, err = e.pendingIn(ctx, stream, v.ID); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(v)
	}
	t := e.table("FIELD", "VALUE")
	t.row("stream", stream)
	if v.Topic != stream {
		t.row("topic", v.Topic)
	}
	t.row("id", v.ID)
	t.row("time", v.Time)
	for _, p := range v.PendingIn {
		t.row("pending in "+p.Group, fmt.Sprintf("consumer %s, idle %s, %d deliveries", p.Consumer, ageText(time.Duration(p.IdleMS)*time.Millisecond), p.Deliveries))
	}
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

// pendingIn returns the groups of stream in which entry id is pending.
func (e *env) pendingIn(ctx context.Context, stream, id string) ([]pendingIn, error) {
	groups, err := e.groups(ctx, stream)
	if err != nil {
		return nil, err
	}
	pipe := e.client.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(groups))
	for i, g := range groups {
		cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: g.Name, Start: id, End: id, Count: 1})
	}
	if len(groups) > 0 {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	out := []pendingIn{}
	for i, g := range groups {
		ps, err := cmds[i].Result()
		if err != nil {
			return nil, e.serverErr(fmt.Sprintf("reading the pending entries of group %q of stream %q", g.Name, stream), err)
		}
		for _, p := range ps {
			out = append(out, pendingIn{Group: g.Name, Consumer: p.Consumer, IdleMS: ms(p.Idle), Deliveries: p.RetryCount})
		}
	}
	return out, nil
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
