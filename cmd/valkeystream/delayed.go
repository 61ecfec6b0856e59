package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	delayed "github.com/echomq/valkeystream/internal/delay"
)

var delayedListCommand = &command{
	name:    "delayed list",
	args:    "<topic-or-stream>",
	summary: "list a topic's delayed messages: due time, UUID; how many wait, next due",
	help: `Lists the delayed messages of a topic: those published with Watermill's
delay metadata that wait, in the sorted set beside the stream (see
docs/delay.md), until they are due. First a summary: the sorted set's key,
how many wait, how many are past due (they move as soon as a subscription
of the topic runs), and the earliest and latest due times. Then the
messages, earliest first: due time by the server's clock, how long until
then, UUID, topic and payload size.`,
	nargs: [2]int{1, 1},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		limit := fs.Int("limit", 100, "list at most this many messages, earliest due first")
		return func(ctx context.Context, e *env, args []string) error {
			if *limit < 1 {
				return usagef("--limit is %d: it must be at least 1", *limit)
			}
			return listDelayed(ctx, e, e.stream(args[0]), *limit)
		}
	},
}

var delayedShowCommand = &command{
	name:    "delayed show",
	args:    "<topic-or-stream> <uuid>",
	summary: "show a delayed message decoded: due time, metadata, payload",
	help: `Shows the delayed message <uuid> of a topic as "entry" shows a stream entry:
its due time, UUID, metadata and the start of its payload (--payload-bytes,
-1 for all of it), as it will be appended to the stream when due. Several
messages with one UUID (published again with other metadata) are all shown.`,
	nargs: [2]int{2, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		n := fs.Int("payload-bytes", 512, "show at most this many bytes of the payload (-1: all)")
		return func(ctx context.Context, e *env, args []string) error {
			return showDelayed(ctx, e, e.stream(args[0]), args[1], *n)
		}
	},
}

var delayedCancelCommand = &command{
	name:    "delayed cancel",
	args:    "<topic-or-stream> (<uuid>... | --all)",
	summary: "remove delayed messages before they are due, by UUID or all of a topic",
	help: `Removes delayed messages of a topic from its sorted set, so that they are
never delivered: those with the UUIDs given, or with --all every one that
waits when the command looks.

Each removal is one ZREM of the message as it was found. A Subscriber moves
a due message into the stream with a script that appends it and removes it
in one atomic step, so a message is either cancelled or moved, never both:
a message moved (or cancelled by someone else) between the look and the
removal is reported "gone", and is then in the stream like any other
(find it with "valkeystream pending" or redis-cli XRANGE). A message
published after the look is not touched.

Asks for confirmation unless --yes; --dry-run shows what would be removed
and changes nothing.`,
	nargs: [2]int{1, -1},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		all := fs.Bool("all", false, "cancel every delayed message of the topic")
		dry := fs.Bool("dry-run", false, "show what would be cancelled; change nothing")
		yes := fs.Bool("yes", false, "do not ask for confirmation")
		return func(ctx context.Context, e *env, args []string) error {
			switch {
			case *all && len(args) > 1:
				return usagef("--all cancels every delayed message: leave out the UUIDs, or leave out --all")
			case !*all && len(args) == 1:
				return usagef("say which delayed messages to cancel: their UUIDs, or --all")
			}
			return cancelDelayed(ctx, e, e.stream(args[0]), args[1:], *dry, *yes)
		}
	},
}

// delayedMessage is a message waiting in a sorted set of delayed messages.
type delayedMessage struct {
	Due          string            `json:"due"`
	DueMS        int64             `json:"due_ms"` // milliseconds since 1970, server clock
	InMS         int64             `json:"in_ms"`  // until due; negative when past due
	UUID         string            `json:"uuid"`
	Topic        string            `json:"topic"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Payload      string            `json:"payload,omitempty"`
	PayloadBytes int               `json:"payload_bytes"`
	DecodeError  string            `json:"decode_error,omitempty"`
	Fields       map[string]string `json:"fields,omitempty"` // raw, when it does not decode

	member string
}

// delayedSet is a stream's sorted set of delayed messages.
type delayedSet struct {
	stream
	DelayedKey string
}

func (e *env) delayedSet(s stream) (delayedSet, error) {
	key, err := valkeystream.DelayedKey(s.Key)
	if err != nil {
		return delayedSet{}, fmt.Errorf("stream %s cannot have delayed messages: %w", s, err)
	}
	return delayedSet{s, key}, nil
}

// serverMS returns the server's clock in milliseconds, the clock of the due
// times.
func (e *env) serverMS(ctx context.Context) (int64, error) {
	t, err := e.client.Time(ctx).Result()
	if err != nil {
		return 0, e.serverErr("reading the server's clock", err)
	}
	return t.UnixMilli(), nil
}

// decode decodes a member of the sorted set of d, due at score, with
// the server's clock at now.
func (d delayedSet) decode(member string, score float64, now int64) delayedMessage {
	due := int64(score)
	m := delayedMessage{Due: timeText(time.UnixMilli(due).UTC()), DueMS: due, InMS: due - now, Topic: d.Topic, member: member}
	fields, err := delayed.DecodeEntry(member)
	if err != nil {
		m.DecodeError = err.Error()
		m.Fields = map[string]string{"(encoded)": member}
		return m
	}
	values := make(map[string]any, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		values[fields[i]] = fields[i+1]
	}
	msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(values)
	if err != nil {
		m.DecodeError = err.Error()
		m.Fields = map[string]string{}
		for k, v := range values {
			m.Fields[k] = v.(string)
		}
		m.UUID = m.Fields[valkeystream.FieldUUID]
		return m
	}
	m.UUID, m.Metadata, m.PayloadBytes = msg.UUID, msg.Metadata, len(msg.Payload)
	m.Payload = string(msg.Payload)
	return m
}

// inText says when a delayed message is due, relative to now.
func inText(inMS int64) string {
	if inMS <= 0 {
		return "past due " + ageText(time.Duration(-inMS)*time.Millisecond)
	}
	return "in " + ageText(time.Duration(inMS)*time.Millisecond)
}

type delayedSummary struct {
	Stream     string           `json:"stream"`
	Topic      string           `json:"topic"`
	DelayedKey string           `json:"delayed_key"`
	Waiting    int64            `json:"waiting"`
	PastDue    int64            `json:"past_due"`
	NextDue    string           `json:"next_due,omitempty"`
	LastDue    string           `json:"last_due,omitempty"`
	Messages   []delayedMessage `json:"messages"`
}

func listDelayed(ctx context.Context, e *env, s stream, limit int) error {
	d, err := e.delayedSet(s)
	if err != nil {
		return err
	}
	now, err := e.serverMS(ctx)
	if err != nil {
		return err
	}
	pipe := e.client.Pipeline()
	card := pipe.ZCard(ctx, d.DelayedKey)
	pastDue := pipe.ZCount(ctx, d.DelayedKey, "-inf", strconv.FormatInt(now, 10))
	first := pipe.ZRangeWithScores(ctx, d.DelayedKey, 0, int64(limit-1))
	last := pipe.ZRangeWithScores(ctx, d.DelayedKey, -1, -1)
	if _, err := pipe.Exec(ctx); err != nil {
		return e.serverErr("reading the delayed messages of stream "+s.String()+" ("+d.DelayedKey+")", err)
	}
	sum := delayedSummary{Stream: s.Key, Topic: s.Topic, DelayedKey: d.DelayedKey, Waiting: card.Val(), PastDue: pastDue.Val(), Messages: []delayedMessage{}}
	for _, z := range first.Val() {
		m := d.decode(z.Member.(string), z.Score, now)
		m.Payload = "" // the list shows its size only
		sum.Messages = append(sum.Messages, m)
	}
	if len(sum.Messages) > 0 {
		sum.NextDue = sum.Messages[0].Due
	}
	if l := last.Val(); len(l) > 0 {
		sum.LastDue = timeText(time.UnixMilli(int64(l[0].Score)).UTC())
	}
	if e.json {
		err = e.printJSON(sum)
	} else {
		err = printDelayedList(e, sum)
	}
	if err != nil {
		return err
	}
	switch {
	case sum.Waiting == 0:
		e.note("no delayed messages wait for stream %s (%s)", s, d.DelayedKey)
	case int64(len(sum.Messages)) < sum.Waiting:
		e.note("showing the first %d of %d; raise --limit for more", len(sum.Messages), sum.Waiting)
	}
	if sum.PastDue > 0 {
		e.note("%d are past due: no subscription of the topic is moving them now (any running Subscriber of the topic does, unless its DelayedPollInterval is negative)", sum.PastDue)
	}
	return nil
}

func printDelayedList(e *env, sum delayedSummary) error {
	t := e.table("STREAM", "TOPIC", "DELAYED SET", "WAITING", "PAST DUE", "NEXT DUE", "LAST DUE")
	t.row(sum.Stream, sum.Topic, sum.DelayedKey, strconv.FormatInt(sum.Waiting, 10), strconv.FormatInt(sum.PastDue, 10), dash(sum.NextDue), dash(sum.LastDue))
	if err := t.flush(); err != nil || len(sum.Messages) == 0 {
		return err
	}
	fmt.Fprintln(e.stdout)
	t = e.table("DUE", "WHEN", "UUID", "TOPIC", "PAYLOAD BYTES")
	for _, m := range sum.Messages {
		uuid := dash(m.UUID)
		if m.DecodeError != "" {
			uuid += " (does not decode)"
		}
		t.row(m.Due, inText(m.InMS), uuid, m.Topic, strconv.Itoa(m.PayloadBytes))
	}
	return t.flush()
}

// delayedPage is how many members one ZSCAN call asks for.
const delayedPage = 1000

// findDelayed returns the delayed messages of d: those with the given
// UUIDs, or all of them when uuids is empty, earliest due first.
func (e *env) findDelayed(ctx context.Context, d delayedSet, uuids []string) ([]delayedMessage, error) {
	now, err := e.serverMS(ctx)
	if err != nil {
		return nil, err
	}
	patterns := []string{"*"}
	if len(uuids) > 0 {
		patterns = patterns[:0]
		for _, u := range uuids {
			patterns = append(patterns, "*"+escapeGlob(u)+"*") // narrows; the UUID is compared decoded
		}
	}
	seen := map[string]bool{}
	var out []delayedMessage
	for _, match := range patterns {
		var cursor uint64
		for {
			page, next, err := e.client.ZScan(ctx, d.DelayedKey, cursor, match, delayedPage).Result()
			if err != nil {
				return nil, e.serverErr("reading the delayed messages of stream "+d.stream.String()+" ("+d.DelayedKey+")", err)
			}
			for i := 0; i+1 < len(page); i += 2 {
				member := page[i]
				if seen[member] {
					continue // ZSCAN may return a member twice
				}
				score, err := strconv.ParseFloat(page[i+1], 64)
				if err != nil {
					return nil, fmt.Errorf("delayed set %q: member with score %q: %w", d.DelayedKey, page[i+1], err)
				}
				m := d.decode(member, score, now)
				if len(uuids) > 0 && !contains(uuids, m.UUID) {
					continue
				}
				seen[member] = true
				out = append(out, m)
			}
			cursor = next
			if cursor == 0 {
				break
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DueMS < out[j].DueMS })
	return out, nil
}

// noDelayed is the error for UUIDs not found waiting.
func noDelayed(d delayedSet, uuids []string) error {
	return fmt.Errorf("no delayed message with UUID %s waits for stream %s (%s): it was moved into the stream when due, cancelled, or never delayed; \"valkeystream delayed list %s\" lists those that wait",
		strings.Join(uuids, ", "), d.stream, d.DelayedKey, d.Topic)
}

func showDelayed(ctx context.Context, e *env, s stream, uuid string, n int) error {
	d, err := e.delayedSet(s)
	if err != nil {
		return err
	}
	found, err := e.findDelayed(ctx, d, []string{uuid})
	if err != nil {
		return err
	}
	if len(found) == 0 {
		return noDelayed(d, []string{uuid})
	}
	if e.json {
		for i := range found {
			if n >= 0 && len(found[i].Payload) > n {
				found[i].Payload = found[i].Payload[:n]
			}
		}
		return e.printJSON(found)
	}
	for i, m := range found {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		t := e.table("FIELD", "VALUE")
		t.row("stream", d.Key)
		t.row("topic", d.Topic)
		t.row("delayed set", d.DelayedKey)
		t.row("due", m.Due+" ("+inText(m.InMS)+")")
		if m.DecodeError != "" {
			t.row("decode error", m.DecodeError)
			for _, k := range sortedKeys(m.Fields) {
				t.row("field "+k, preview(m.Fields[k], n))
			}
		} else {
			t.row("uuid", m.UUID)
			for _, k := range sortedKeys(m.Metadata) {
				t.row("metadata "+k, m.Metadata[k])
			}
			t.row("payload", preview(m.Payload, n))
			t.row("payload bytes", strconv.Itoa(m.PayloadBytes))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	return nil
}

type cancelResult struct {
	UUID   string `json:"uuid"`
	Due    string `json:"due"`
	Result string `json:"result"` // cancelled, gone, would-cancel
}

func cancelDelayed(ctx context.Context, e *env, s stream, uuids []string, dry, yes bool) error {
	d, err := e.delayedSet(s)
	if err != nil {
		return err
	}
	found, err := e.findDelayed(ctx, d, uuids)
	if err != nil {
		return err
	}
	if len(found) == 0 {
		if len(uuids) > 0 {
			return noDelayed(d, uuids)
		}
		e.note("no delayed messages wait for stream %s (%s); nothing to cancel", s, d.DelayedKey)
		if e.json {
			return e.printJSON([]cancelResult{})
		}
		return nil
	}
	var missing []string
	for _, u := range uuids {
		if !containsUUID(found, u) {
			missing = append(missing, u)
		}
	}
	results := make([]cancelResult, len(found))
	for i, m := range found {
		results[i] = cancelResult{UUID: dash(m.UUID), Due: m.Due}
	}
	if dry {
		for i := range results {
			results[i].Result = "would-cancel"
		}
		e.note("dry run: nothing was changed")
		return printCancel(e, results, d, missing)
	}
	if err := e.confirm(yes, fmt.Sprintf("Cancel %d delayed messages of stream %s (remove them from %s)?", len(found), s, d.DelayedKey)); err != nil {
		return err
	}
	pipe := e.client.Pipeline()
	cmds := make([]*redis.IntCmd, len(found))
	for i, m := range found {
		cmds[i] = pipe.ZRem(ctx, d.DelayedKey, m.member)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var failed error
	for i, c := range cmds {
		n, err := c.Result()
		switch {
		case err != nil:
			results[i].Result = "failed: " + err.Error()
			if failed == nil {
				failed = e.serverErr("removing delayed messages from "+strconv.Quote(d.DelayedKey), err)
			}
		case n == 1:
			results[i].Result = "cancelled"
		default:
			results[i].Result = "gone"
		}
	}
	if err := printCancel(e, results, d, missing); err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("%w; run the command again to cancel the rest", failed)
	}
	return nil
}

func containsUUID(ms []delayedMessage, uuid string) bool {
	for _, m := range ms {
		if m.UUID == uuid {
			return true
		}
	}
	return false
}

func printCancel(e *env, results []cancelResult, d delayedSet, missing []string) error {
	gone := 0
	for _, r := range results {
		if r.Result == "gone" {
			gone++
		}
	}
	if gone > 0 {
		e.note("%d were gone when removed: moved into stream %s when due, or cancelled by someone else meanwhile", gone, d.stream)
	}
	if len(missing) > 0 {
		e.note("no delayed message waits with UUID %s", strings.Join(missing, ", "))
	}
	if e.json {
		return e.printJSON(results)
	}
	t := e.table("UUID", "DUE", "RESULT")
	for _, r := range results {
		t.row(r.UUID, r.Due, r.Result)
	}
	return t.flush()
}
