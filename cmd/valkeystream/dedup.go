package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/dedupmark"
)

const dedupHelpKeys = `A Deduplicator keeps one mark per message UUID and namespace: the key
<dedup-prefix><namespace>:<uuid>, where the dedup prefix is
DedupConfig.KeyPrefix (default valkeystream:dedup:, --dedup-prefix) and the
namespace is DedupConfig.Namespace or, by default, the stream key and the
consumer group the message came from, joined by ":". Name the marks of one
group with <topic-or-stream> <group>, of a namespace with --namespace, or
give the UUID alone to find every mark of it (SCAN over the whole key
space, on every master of a cluster: slow on a large database).`

var dedupShowCommand = &command{
	name:    "dedup show",
	args:    "<uuid> [<topic-or-stream> <group>]",
	summary: "show a message's deduplication marks: done or in progress, TTL, group",
	help: `Shows the marks a Deduplicator keeps for the message <uuid>: its key, the
namespace and, when the namespace is a stream and one of its groups, which,
the state ("done": a handling succeeded, and a duplicate delivered before
the mark expires is acknowledged without running the handler;
"in-progress": a handling holds it now, or held it when its process died;
"seen": a key of ExpiringKeyRepository, Watermill's deduplicator) and the
time the mark has left to live.

` + dedupHelpKeys,
	nargs: [2]int{1, 3},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		sel := addDedupSelect(fs)
		return func(ctx context.Context, e *env, args []string) error {
			marks, err := findMarks(ctx, e, *sel, args)
			if err != nil {
				return err
			}
			if len(marks) == 0 {
				return noMarks(*sel, args)
			}
			return printMarks(e, marks)
		}
	},
}

var dedupClearCommand = &command{
	name:    "dedup clear",
	args:    "<uuid> [<topic-or-stream> <group>]",
	summary: "remove a message's deduplication marks, so that it is handled again",
	help: `Removes the marks a Deduplicator keeps for the message <uuid> (see "dedup
show"), so that its next delivery, or a copy published again, runs the
handler instead of being acknowledged as a duplicate.

Only done marks (and ExpiringKeyRepository keys) are removed unless
--in-progress is given: removing the mark of a handling in progress lets a
redelivery run the handler alongside it, and that handling still marks the
message done when it succeeds. Each removal deletes the key only if it
still holds the value shown (a server-side script), so a mark that changed
meanwhile (a handling that ended, or began) is kept and reported "changed".

Asks for confirmation unless --yes; --dry-run shows what would be removed
and changes nothing.

` + dedupHelpKeys,
	nargs: [2]int{1, 3},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		sel := addDedupSelect(fs)
		running := fs.Bool("in-progress", false, "remove in-progress marks too")
		dry := fs.Bool("dry-run", false, "show what would be removed; change nothing")
		yes := fs.Bool("yes", false, "do not ask for confirmation")
		return func(ctx context.Context, e *env, args []string) error {
			marks, err := findMarks(ctx, e, *sel, args)
			if err != nil {
				return err
			}
			if len(marks) == 0 {
				return noMarks(*sel, args)
			}
			return clearMarks(ctx, e, args[0], marks, *running, *dry, *yes)
		}
	},
}

// dedupSelect says where to look for a UUID's marks.
type dedupSelect struct {
	prefix    string
	namespace string
}

func addDedupSelect(fs *flagSet) *dedupSelect {
	s := &dedupSelect{}
	fs.StringVar(&s.prefix, "dedup-prefix", valkeystream.DefaultDedupKeyPrefix, "the Deduplicator's `KeyPrefix`")
	fs.StringVar(&s.namespace, "namespace", "", "the Deduplicator's `Namespace`, when it was given one")
	return s
}

// mark is one deduplication mark.
type mark struct {
	Key       string `json:"key"`
	Namespace string `json:"namespace"`
	Stream    string `json:"stream,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Group     string `json:"group,omitempty"`
	State     string `json:"state"` // done, in-progress, seen, or the value
	Holder    string `json:"holder,omitempty"`
	TTLMS     int64  `json:"ttl_ms"` // -1: no expiry

	value string
}

// findMarks returns the marks of the message args[0] that sel and the
// optional <topic-or-stream> <group> of args select.
func findMarks(ctx context.Context, e *env, sel dedupSelect, args []string) ([]mark, error) {
	uuid := args[0]
	var keys []string
	switch {
	case len(args) == 2:
		return nil, usagef("give the topic or stream and the group, or neither: %q alone names no group", args[1])
	case len(args) == 3 && sel.namespace != "":
		return nil, usagef("give either <topic-or-stream> <group> or --namespace, not both")
	case len(args) == 3:
		keys = []string{dedupmark.Key(sel.prefix, dedupmark.GroupNamespace(e.stream(args[1]).Key, args[2]), uuid)}
	case sel.namespace != "":
		keys = []string{dedupmark.Key(sel.prefix, sel.namespace, uuid)}
	default:
		found, err := scanKeys(ctx, e.client, escapeGlob(sel.prefix)+"*"+escapeGlob(uuid))
		if err != nil {
			return nil, e.serverErr("looking for the marks of message "+uuid, err)
		}
		for _, k := range found {
			rest := strings.TrimSuffix(strings.TrimPrefix(k, sel.prefix), uuid)
			if rest == "" || strings.HasSuffix(rest, ":") {
				keys = append(keys, k)
			}
		}
	}
	pipe := e.client.Pipeline()
	values := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		values[i] = pipe.Get(ctx, k)
		ttls[i] = pipe.PTTL(ctx, k)
	}
	if len(keys) > 0 {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	var marks []mark
	for i, k := range keys {
		v, err := values[i].Result()
		if errors.Is(err, redis.Nil) {
			continue // expired or removed since the scan
		}
		if err != nil {
			return nil, e.serverErr("reading mark "+strconv.Quote(k), err)
		}
		ns := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(k, sel.prefix), uuid), ":")
		m := mark{Key: k, Namespace: ns, TTLMS: -1, value: v}
		if d := ttls[i].Val(); d > 0 {
			m.TTLMS = ms(d)
		}
		switch {
		case v == dedupmark.Done:
			m.State = "done"
		case dedupmark.IsRunning(v):
			m.State, m.Holder = "in-progress", strings.TrimPrefix(v, dedupmark.Running)
		case v == "1" && !strings.Contains(k[len(sel.prefix):], ":"):
			m.State = "seen"
		default:
			m.State = "unknown value " + strconv.Quote(v)
		}
		marks = append(marks, m)
	}
	if err := e.markGroups(ctx, marks); err != nil {
		return nil, err
	}
	return marks, nil
}

// markGroups fills in the stream and group of the marks whose namespace is
// a stream key and one of its groups, as a Deduplicator without Namespace
// writes it. A namespace "a:b:c" may be stream "a:b" and group "c", or
// stream "a" and group "b:c": the first split that names an existing group
// is taken.
func (e *env) markGroups(ctx context.Context, marks []mark) error {
	type split struct {
		mark          int
		stream, group string
		cmd           *redis.XInfoGroupsCmd
	}
	var splits []*split
	pipe := e.client.Pipeline()
	for i, m := range marks {
		for j := len(m.Namespace) - 1; j > 0; j-- {
			if m.Namespace[j] == ':' {
				s := &split{mark: i, stream: m.Namespace[:j], group: m.Namespace[j+1:]}
				s.cmd = pipe.XInfoGroups(ctx, s.stream)
				splits = append(splits, s)
			}
		}
	}
	if len(splits) == 0 {
		return nil
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error: most name no stream
	for _, s := range splits {
		m := &marks[s.mark]
		if m.Group != "" {
			continue
		}
		groups, err := s.cmd.Result()
		if err != nil {
			continue
		}
		if slices.ContainsFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == s.group }) {
			m.Stream, m.Group, m.Topic = s.stream, s.group, e.topicOf(s.stream)
		}
	}
	return nil
}

func noMarks(sel dedupSelect, args []string) error {
	where := "under " + strconv.Quote(sel.prefix)
	switch {
	case len(args) == 3:
		where = fmt.Sprintf("for group %q of %q", args[2], args[1])
	case sel.namespace != "":
		where = "in namespace " + strconv.Quote(sel.namespace)
	}
	return fmt.Errorf("message %s has no deduplication mark %s: it was not handled through a Deduplicator, its mark expired (done marks last DedupConfig.Window), or the Deduplicator has another KeyPrefix (--dedup-prefix)", args[0], where)
}

func ttlText(ms int64) string {
	if ms < 0 {
		return "no expiry"
	}
	return ageText(time.Duration(ms) * time.Millisecond)
}

func printMarks(e *env, marks []mark) error {
	if e.json {
		return e.printJSON(marks)
	}
	t := e.table("KEY", "STATE", "TTL", "TOPIC", "STREAM", "GROUP", "NAMESPACE")
	for _, m := range marks {
		t.row(m.Key, m.State, ttlText(m.TTLMS), dash(m.Topic), dash(m.Stream), dash(m.Group), dash(m.Namespace))
	}
	return t.flush()
}

type clearResult struct {
	mark
	Result string `json:"result"` // cleared, would-clear, kept-in-progress, changed
}

func clearMarks(ctx context.Context, e *env, uuid string, marks []mark, running, dry, yes bool) error {
	results := make([]clearResult, len(marks))
	todo := 0
	for i, m := range marks {
		results[i].mark = m
		if m.State == "in-progress" && !running {
			results[i].Result = "kept-in-progress"
			continue
		}
		todo++
	}
	if todo == 0 {
		_ = printClear(e, results)
		return errors.New("every mark found is in progress and was kept: a handling holds it, or held it when its process died and it expires within the Deduplicator's RunningTTL; give --in-progress to remove it anyway")
	}
	if dry {
		for i := range results {
			if results[i].Result == "" {
				results[i].Result = "would-clear"
			}
		}
		e.note("dry run: nothing was changed")
		return printClear(e, results)
	}
	if err := e.confirm(yes, fmt.Sprintf("Remove %d deduplication marks of message %s, so that it is handled again?", todo, uuid)); err != nil {
		return err
	}
	for i := range results {
		r := &results[i]
		if r.Result != "" {
			continue
		}
		n, err := dedupmark.CompareAndDelete.Run(ctx, e.client, []string{r.Key}, r.value).Int()
		if err != nil {
			_ = printClear(e, results[:i])
			return e.serverErr("removing mark "+strconv.Quote(r.Key), err)
		}
		r.Result = "cleared"
		if n == 0 {
			r.Result = "changed"
		}
	}
	return printClear(e, results)
}

func printClear(e *env, results []clearResult) error {
	if e.json {
		return e.printJSON(results)
	}
	t := e.table("KEY", "STATE", "GROUP", "RESULT")
	for _, r := range results {
		t.row(r.Key, r.State, dash(r.Group), r.Result)
	}
	return t.flush()
}

// scanKeys returns the keys that match the SCAN pattern match, sorted: on a
// cluster, those of every master.
func scanKeys(ctx context.Context, c redis.UniversalClient, match string) ([]string, error) {
	scan := func(ctx context.Context, c redis.Cmdable) ([]string, error) {
		var keys []string
		var cursor uint64
		for {
			page, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return nil, err
			}
			keys = append(keys, page...)
			if cursor = next; cursor == 0 {
				return keys, nil
			}
		}
	}
	return onEveryNode(ctx, c, scan)
}
