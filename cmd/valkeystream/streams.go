package main

import (
	"context"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var streamsCommand = &command{
	name:    "streams",
	args:    "",
	summary: "list streams with their length, first and last entry time and groups",
	help: `Lists the streams whose key starts with --prefix (all streams without it),
found with SCAN ... TYPE stream, with their topic (the key without the
prefix), their length, the time of their first and last entry (from the
entry ids), and their consumer groups.`,
	nargs: [2]int{0, 0},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		limit := fs.Int("limit", 1000, "list at most this many streams")
		return func(ctx context.Context, e *env, _ []string) error {
			return listStreams(ctx, e, e.prefix, *limit)
		}
	},
}

type streamInfo struct {
	Stream      string   `json:"stream"`
	Topic       string   `json:"topic"`
	Length      int64    `json:"length"`
	FirstID     string   `json:"first_id,omitempty"`
	FirstTime   string   `json:"first_time,omitempty"`
	LastID      string   `json:"last_id,omitempty"`
	LastTime    string   `json:"last_time,omitempty"`
	Groups      []string `json:"groups"`
	LastAddedID string   `json:"last_generated_id"`
}

func listStreams(ctx context.Context, e *env, prefix string, limit int) error {
	if limit < 1 {
		return usagef("--limit is %d: it must be at least 1", limit)
	}
	keys, err := scanStreams(ctx, e.client, prefix, limit)
	if err != nil {
		return e.serverErr("listing streams", err)
	}
	// One round trip for all of them.
	pipe := e.client.Pipeline()
	streams := make([]*redis.XInfoStreamCmd, len(keys))
	groups := make([]*redis.XInfoGroupsCmd, len(keys))
	for i, key := range keys {
		streams[i] = pipe.XInfoStream(ctx, key)
		groups[i] = pipe.XInfoGroups(ctx, key)
	}
	if len(keys) > 0 {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	infos := make([]streamInfo, 0, len(keys))
	for i, key := range keys {
		info, err := streams[i].Result()
		if redis.HasErrorPrefix(err, "no such key") {
			continue // deleted since the scan
		}
		if err != nil {
			return e.serverErr("reading stream "+strconv.Quote(key), err)
		}
		gs, err := groups[i].Result()
		if redis.HasErrorPrefix(err, "no such key") {
			continue
		}
		if err != nil {
			return e.serverErr("reading the groups of stream "+strconv.Quote(key), err)
		}
		si := streamInfo{Stream: key, Topic: e.topicOf(key), Length: info.Length, Groups: []string{}, LastAddedID: info.LastGeneratedID}
		if info.Length > 0 {
			si.FirstID, si.LastID = info.FirstEntry.ID, info.LastEntry.ID
			si.FirstTime, si.LastTime = timeText(idTime(si.FirstID)), timeText(idTime(si.LastID))
		}
		for _, g := range gs {
			si.Groups = append(si.Groups, g.Name)
		}
		infos = append(infos, si)
	}
	if e.json {
		return e.printJSON(infos)
	}
	t := e.table("STREAM", "TOPIC", "LENGTH", "FIRST ENTRY", "LAST ENTRY", "GROUPS")
	for _, si := range infos {
		groups := strings.Join(si.Groups, ",")
		if groups == "" {
			groups = "-"
		}
		t.row(si.Stream, si.Topic, strconv.FormatInt(si.Length, 10), dash(si.FirstTime), dash(si.LastTime), groups)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(infos) == 0 {
		e.note("no streams found with prefix %q", prefix)
	} else if len(keys) == limit {
		e.note("showing the first %d streams; raise --limit or narrow --prefix for more", limit)
	}
	return nil
}

// scanNode returns up to limit stream keys starting with prefix, sorted, of
// the one server c talks to.
func scanNode(ctx context.Context, c redis.Cmdable, prefix string, limit int) ([]string, error) {
	match := escapeGlob(prefix) + "*"
	seen := map[string]bool{}
	var cursor uint64
	for {
		keys, next, err := c.ScanType(ctx, cursor, match, 500, "stream").Result()
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			seen[k] = true
		}
		cursor = next
		if cursor == 0 || len(seen) >= limit {
			break
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys[:min(limit, len(keys))], nil
}

// escapeGlob escapes the characters SCAN MATCH treats as a pattern.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
