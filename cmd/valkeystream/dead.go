package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// deadNaming explains, in the help of the dead-letter commands, how they
// find the dead-letter stream.
const deadNaming = `Name the topic the dead letters came from (orders), the dead-letter topic
(orders.dead) or its stream key; with --prefix, topics get the prefix. A
name whose stream key ends in ".dead" is the dead-letter stream; any other
is the topic they came from when its stream plus ".dead" exists, and else
a dead-letter stream of another name (DeadLetterConfig.Topic), which must
hold dead letters.`

var deadListCommand = &command{
	name:    "dead list",
	args:    "<topic-or-dead-letter-stream>",
	summary: "list dead letters with why they failed and where they came from",
	help: `Lists the dead letters of a topic, oldest first: the dead letter's entry id,
the message UUID, the stream and entry it came from, the group and consumer
whose delivery failed last, its delivery count then, and the error.
Without --json the error is cut to fit; --json shows all of it.

` + deadNaming,
	nargs: [2]int{1, 1},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		f := addDeadFilter(fs)
		return func(ctx context.Context, e *env, args []string) error {
			dead, err := e.deadStream(ctx, args[0])
			if err != nil {
				return err
			}
			e.noteDead(args[0], dead)
			f.resolve(e)
			letters, err := readDead(ctx, e, dead.Key, *f)
			if err != nil {
				return err
			}
			return printDead(e, dead.Key, letters, *f)
		}
	},
}

// deadFilter selects dead letters.
type deadFilter struct {
	ids           stringList
	originStream  string
	group         string
	consumer      string
	errorContains string
	limit         int
}

func addDeadFilter(fs *flagSet) *deadFilter {
	f := &deadFilter{}
	fs.Var(&f.ids, "id", "only the dead letter with this entry `id` (repeat the flag, or separate ids with commas)")
	fs.StringVar(&f.originStream, "origin-stream", "", "only dead letters that came from this `topic or stream`")
	fs.StringVar(&f.group, "group", "", "only dead letters given up by this consumer `group`")
	fs.StringVar(&f.consumer, "consumer", "", "only dead letters whose last failed delivery was to this `consumer`")
	fs.StringVar(&f.errorContains, "error-contains", "", "only dead letters whose error contains this `text`")
	fs.IntVar(&f.limit, "limit", 1000, "consider at most this many dead letters, oldest first")
	return f
}

// resolve makes the filters that name a stream name its key.
func (f *deadFilter) resolve(e *env) {
	if f.originStream != "" {
		f.originStream = e.stream(f.originStream).Key
	}
}

func (f deadFilter) narrows() bool {
	return len(f.ids) > 0 || f.originStream != "" || f.group != "" || f.consumer != "" || f.errorContains != ""
}

func (f deadFilter) match(d deadLetter) bool {
	switch {
	case len(f.ids) > 0 && !contains(f.ids, d.ID),
		f.originStream != "" && d.OriginStream != f.originStream,
		f.group != "" && d.Group != f.group,
		f.consumer != "" && d.Consumer != f.consumer,
		f.errorContains != "" && !strings.Contains(d.Error, f.errorContains):
		return false
	}
	return true
}

// stringList is a flag that may be repeated and holds comma-separated values.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// deadLetter is a dead letter as the library writes it (see the
// valkeystream.MetadataOriginal* keys).
type deadLetter struct {
	ID            string `json:"id"`
	Time          string `json:"time"`
	UUID          string `json:"uuid"`
	OriginTopic   string `json:"origin_topic"`
	OriginStream  string `json:"origin_stream"`
	OriginEntryID string `json:"origin_entry_id"`
	Group         string `json:"group"`
	Consumer      string `json:"consumer"`
	Deliveries    string `json:"deliveries"`
	Error         string `json:"error"`

	fields map[string]any
}

// deadKeys are the fields a dead letter has beside the message's own.
var deadKeys = []string{
	valkeystream.MetadataError,
	valkeystream.MetadataOriginalTopic,
	valkeystream.MetadataOriginalStream,
	valkeystream.MetadataOriginalEntryID,
	valkeystream.MetadataOriginalGroup,
	valkeystream.MetadataOriginalConsumer,
	valkeystream.MetadataOriginalDeliveryCount,
}

func toDeadLetter(m redis.XMessage) deadLetter {
	text := func(k string) string { return fieldText(m.Values[k]) }
	return deadLetter{
		ID: m.ID, Time: timeText(idTime(m.ID)), UUID: text(valkeystream.FieldUUID),
		OriginTopic:   text(valkeystream.MetadataOriginalTopic),
		OriginStream:  text(valkeystream.MetadataOriginalStream),
		OriginEntryID: text(valkeystream.MetadataOriginalEntryID),
		Group:         text(valkeystream.MetadataOriginalGroup),
		Consumer:      text(valkeystream.MetadataOriginalConsumer),
		Deliveries:    text(valkeystream.MetadataOriginalDeliveryCount),
		Error:         text(valkeystream.MetadataError),
		fields:        m.Values,
	}
}

// deadPage is how many entries one XRANGE of a dead-letter stream reads.
const deadPage = 500

// readDead returns the dead letters of stream that f selects.
func readDead(ctx context.Context, e *env, stream string, f deadFilter) ([]deadLetter, error) {
	if f.limit < 1 {
		return nil, usagef("--limit is %d: it must be at least 1", f.limit)
	}
	n, err := e.client.Exists(ctx, stream).Result()
	if err != nil {
		return nil, e.serverErr("reading dead-letter stream "+strconv.Quote(stream), err)
	}
	if n == 0 {
		return nil, fmt.Errorf("dead-letter stream %q does not exist (dead letters go to a topic's stream plus %q; run \"valkeystream streams\" to list streams)",
			stream, valkeystream.DefaultDeadLetterSuffix)
	}
	var out []deadLetter
	if len(f.ids) > 0 {
		// Read the named entries only.
		for _, id := range f.ids {
			msgs, err := e.client.XRange(ctx, stream, id, id).Result()
			if isBadID(err) {
				return nil, usagef("--id %q is not a stream entry id (they look like 1700000000000-0)", id)
			}
			if err != nil {
				return nil, e.serverErr("reading dead-letter stream "+strconv.Quote(stream), err)
			}
			for _, m := range msgs {
				if d := toDeadLetter(m); f.match(d) {
					out = append(out, d)
				}
			}
		}
		sort.Slice(out, func(i, j int) bool { return lessID(out[i].ID, out[j].ID) })
		return out[:min(len(out), f.limit)], nil
	}
	start := "-"
	read := 0
	for read < f.limit {
		msgs, err := e.client.XRangeN(ctx, stream, start, "+", int64(min(deadPage, f.limit-read))).Result()
		if err != nil {
			return nil, e.serverErr("reading dead-letter stream "+strconv.Quote(stream), err)
		}
		for _, m := range msgs {
			if d := toDeadLetter(m); f.match(d) {
				out = append(out, d)
			}
		}
		read += len(msgs)
		if len(msgs) == 0 || read >= f.limit {
			break
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	return out, nil
}

// lessID orders stream entry ids.
func lessID(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	an, _ := strconv.ParseUint(am, 10, 64)
	bn, _ := strconv.ParseUint(bm, 10, 64)
	if an != bn {
		return an < bn
	}
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return asq < bsq
}

func printDead(e *env, stream string, letters []deadLetter, f deadFilter) error {
	if letters == nil {
		letters = []deadLetter{}
	}
	if e.json {
		return e.printJSON(letters)
	}
	t := e.table("ID", "UUID", "ORIGIN", "GROUP", "CONSUMER", "DELIVERIES", "ERROR")
	for _, d := range letters {
		origin := "-"
		if d.OriginStream != "" {
			origin = d.OriginStream + " " + dash(d.OriginEntryID)
		}
		t.row(d.ID, dash(d.UUID), origin, dash(d.Group), dash(d.Consumer), dash(d.Deliveries), clip(dash(d.Error), 60))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(letters) == 0 {
		e.note("no dead letters match in %q", stream)
	} else if len(letters) == f.limit {
		e.note("showing the first %d; raise --limit for more", f.limit)
	}
	return nil
}

var deadReplayCommand = &command{
	name:    "dead replay",
	args:    "<topic-or-dead-letter-stream>",
	summary: "publish dead letters back to the stream they came from, once each",
	help: `Appends dead letters of <dead-letter-stream> back to the stream each came from
(its valkeystream_original_stream), as the message it was: same UUID, payload
and metadata, without the dead-letter keys. Then deletes it from the
dead-letter stream. Say which: --all, or --id and the filters of "dead list".

Each dead letter is replayed exactly once, even if the command is
interrupted and run again, or run twice at once: the append happens in a
server-side script that first looks up, and then records, the dead letter's
id in a hash in the same slot as the target stream
(<stream>:valkeystream-replayed, or {<stream>}:valkeystream-replayed),
kept for 7 days after the last replay into that stream. Only then is the
dead letter deleted, so a crash between the steps leaves it to be found
already replayed next time, never appended twice and never lost.

` + deadNaming + `

A replay goes only to the consumer group that gave up on the dead letter
(its valkeystream_original_group): the appended entry carries
valkeystream_replay_group, and subscriptions of the stream's other groups
acknowledge it without delivering it, so a group that handled the message
already does not get it again. --all-groups replays to every group (as does a
dead letter that names no group). --dry-run lists the groups each one would
reach.

Dead letters without an origin stream (not written by valkeystream) are
skipped and listed. Asks for confirmation unless --yes; --dry-run shows what
would happen and changes nothing.`,
	nargs: [2]int{1, 1},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		f := addDeadFilter(fs)
		all := fs.Bool("all", false, "replay every dead letter in the stream (up to --limit)")
		dry := fs.Bool("dry-run", false, "show what would be replayed, and to which groups; change nothing")
		allGroups := fs.Bool("all-groups", false, "replay to every consumer group of the stream, not only the one that gave up on the dead letter")
		yes := fs.Bool("yes", false, "do not ask for confirmation")
		return func(ctx context.Context, e *env, args []string) error {
			switch {
			case *all && f.narrows():
				return usagef("--all replays every dead letter: leave out --id and the filters, or leave out --all")
			case !*all && !f.narrows():
				return usagef("say which dead letters to replay: --all, --id, or a filter (--origin-stream, --group, --consumer, --error-contains)")
			}
			dead, err := e.deadStream(ctx, args[0])
			if err != nil {
				return err
			}
			e.noteDead(args[0], dead)
			f.resolve(e)
			return replayDead(ctx, e, dead.Key, *f, replayOptions{dry: *dry, yes: *yes, allGroups: *allGroups})
		}
	},
}

// replayMarkerTTL is how long a target stream's replay markers are kept after
// the last replay into it.
const replayMarkerTTL = 7 * 24 * time.Hour

// replayScript appends a dead letter's message to KEYS[1] unless KEYS[2]
// records it as appended already, and records it. ARGV: the marker field,
// the marker TTL in seconds, then the entry's fields and values. It returns
// {1, new id} or {0, id appended before}.
var replayScript = redis.NewScript(`
local done = redis.call('HGET', KEYS[2], ARGV[1])
if done then
	return {0, done}
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('HSET', KEYS[2], ARGV[1], id)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {1, id}
`)

// markerKey returns the key of the replay markers of stream: a key in the
// same cluster slot, so that one script may use both. That is not possible
// for a name with a "}" outside a hash tag.
func markerKey(stream string) string {
	const suffix = ":valkeystream-replayed"
	if open := strings.IndexByte(stream, '{'); open >= 0 {
		if end := strings.IndexByte(stream[open+1:], '}'); end > 0 {
			return stream + suffix // the stream's own hash tag decides the slot
		}
	}
	if strings.IndexByte(stream, '}') >= 0 {
		// No key in the stream's slot can be named: on a cluster the
		// script fails with CROSSSLOT, and nothing is appended.
		return stream + suffix
	}
	return "{" + stream + "}" + suffix
}

type replayResult struct {
	deadLetter
	Stream string `json:"stream"`
	// ForGroup is the one group the replay is for, "" for every group;
	// Groups the groups of the stream it reaches (read for the dry run).
	ForGroup string   `json:"for_group,omitempty"`
	Groups   []string `json:"groups,omitempty"`
	NewID    string   `json:"new_id,omitempty"`
	Result   string   `json:"result"` // appended, already-appended, would-append, skipped
	Reason   string   `json:"reason,omitempty"`
}

// replayOptions are the choices of a dead replay.
type replayOptions struct {
	dry, yes  bool
	allGroups bool // replay to every group, not only the one that gave up
}

func replayDead(ctx context.Context, e *env, stream string, f deadFilter, o replayOptions) error {
	dry, yes := o.dry, o.yes
	letters, err := readDead(ctx, e, stream, f)
	if err != nil {
		return err
	}
	if len(letters) == 0 {
		e.note("no dead letters match in %q; nothing to replay", stream)
		if e.json {
			return e.printJSON([]replayResult{})
		}
		return nil
	}
	if len(letters) == f.limit {
		e.note("taking the first %d dead letters (--limit); run the command again for the rest", f.limit)
	}
	results := make([]replayResult, len(letters))
	targets := map[string]int{}
	replayable := 0
	for i, d := range letters {
		r := replayResult{deadLetter: d, Stream: d.OriginStream}
		if !o.allGroups {
			r.ForGroup = d.Group
		}
		if d.OriginStream == "" {
			r.Result, r.Reason = "skipped", "no "+valkeystream.MetadataOriginalStream+" field: not a valkeystream dead letter"
		} else {
			replayable++
			targets[d.OriginStream]++
		}
		results[i] = r
	}

	if dry {
		for i := range results {
			r := &results[i]
			if r.Result != "" {
				continue
			}
			groups, err := replayGroups(ctx, e, r.Stream, r.ForGroup)
			if err != nil {
				return err
			}
			r.Groups = groups
			prev, err := e.client.HGet(ctx, markerKey(r.Stream), markerField(stream, r.ID)).Result()
			switch {
			case err == nil:
				r.Result, r.NewID = "already-appended", prev
			case errors.Is(err, redis.Nil):
				r.Result = "would-append"
			default:
				return e.serverErr("reading the replay markers of stream "+strconv.Quote(r.Stream), err)
			}
		}
		e.note("dry run: nothing was changed")
		return printReplay(e, results)
	}

	if replayable == 0 {
		_ = printReplay(e, results)
		return fmt.Errorf("none of the %d dead letters selected has an origin stream; nothing was replayed", len(letters))
	}
	names := make([]string, 0, len(targets))
	for t, n := range targets {
		names = append(names, fmt.Sprintf("%s (%d)", t, n))
	}
	sort.Strings(names)
	if err := e.confirm(yes, fmt.Sprintf("Append %d dead letters of %s to %s, and delete them from %s?",
		replayable, stream, strings.Join(names, ", "), stream)); err != nil {
		return err
	}

	var failed error
	for i := range results {
		r := &results[i]
		if r.Result != "" {
			continue
		}
		if err := replayOne(ctx, e, stream, r); err != nil {
			failed = err
			r.Result, r.Reason = "failed", err.Error()
			break // the rest keep their place; running again resumes
		}
	}
	if err := printReplay(e, results); err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("%w; the dead letters not replayed stay in %s: run the command again to go on", failed, stream)
	}
	return nil
}

func markerField(deadStream, id string) string { return deadStream + " " + id }

// replayOne appends r's message to its stream once, then deletes the dead
// letter.
func replayOne(ctx context.Context, e *env, deadStream string, r *replayResult) error {
	args := []any{markerField(deadStream, r.ID), int64(replayMarkerTTL / time.Second)}
	args = append(args, replayFields(r.fields, r.ForGroup)...)
	res, err := replayScript.Run(ctx, e.client, []string{r.Stream, markerKey(r.Stream)}, args...).Slice()
	if err != nil {
		return e.serverErr(fmt.Sprintf("appending dead letter %s to stream %q", r.ID, r.Stream), err)
	}
	if len(res) != 2 {
		return fmt.Errorf("appending dead letter %s to stream %q: unexpected script reply %v", r.ID, r.Stream, res)
	}
	r.NewID = fieldText(res[1])
	r.Result = "appended"
	if n, _ := res[0].(int64); n == 0 {
		r.Result = "already-appended"
	}
	if err := e.client.XDel(ctx, deadStream, r.ID).Err(); err != nil {
		return e.serverErr(fmt.Sprintf("deleting dead letter %s from %q after appending it to %q as %s (it will not be appended again)", r.ID, deadStream, r.Stream, r.NewID), err)
	}
	return nil
}

// replayFields returns the fields of the message a dead letter holds: its
// own fields without the dead-letter keys, the UUID and payload first, the
// rest in key order (as DefaultMarshaler writes them).
// replayFields returns the fields of the message a dead letter holds: its
// own fields without the dead-letter keys (and without the group of an
// earlier replay), the UUID and payload first, the rest in key order (as
// DefaultMarshaler writes them), then the group the replay is for, if one.
func replayFields(fields map[string]any, forGroup string) []any {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if k != valkeystream.FieldUUID && k != valkeystream.FieldPayload && k != valkeystream.MetadataReplayGroup && !contains(deadKeys, k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]any, 0, 2*len(keys)+6)
	for _, k := range []string{valkeystream.FieldUUID, valkeystream.FieldPayload} {
		if v, ok := fields[k]; ok {
			out = append(out, k, fieldText(v))
		}
	}
	for _, k := range keys {
		out = append(out, k, fieldText(fields[k]))
	}
	if forGroup != "" {
		out = append(out, valkeystream.MetadataReplayGroup, forGroup)
	}
	return out
}

// replayGroups returns the groups of stream a replay for forGroup ("" for
// every group) reaches.
func replayGroups(ctx context.Context, e *env, stream, forGroup string) ([]string, error) {
	groups, err := e.client.XInfoGroups(ctx, stream).Result()
	if err != nil && !redis.HasErrorPrefix(err, "ERR no such key") && !redis.HasErrorPrefix(err, "no such key") {
		return nil, e.serverErr("reading the consumer groups of stream "+strconv.Quote(stream), err)
	}
	var names []string
	for _, g := range groups {
		if forGroup == "" || g.Name == forGroup {
			names = append(names, g.Name)
		}
	}
	return names, nil
}

func printReplay(e *env, results []replayResult) error {
	if e.json {
		return e.printJSON(results)
	}
	t := e.table("DEAD LETTER", "UUID", "TO STREAM", "FOR GROUP", "RESULT", "NEW ID")
	for _, r := range results {
		res := r.Result
		if res == "" {
			res = "not-attempted"
		}
		if r.Reason != "" {
			res += ": " + clip(r.Reason, 70)
		}
		forGroup := r.ForGroup
		if forGroup == "" {
			forGroup = "(every group)"
		}
		if r.Groups != nil || r.Result == "would-append" {
			forGroup += " -> reaches " + dash(strings.Join(r.Groups, ","))
		}
		t.row(r.ID, dash(r.UUID), dash(r.Stream), forGroup, res, dash(r.NewID))
	}
	return t.flush()
}
