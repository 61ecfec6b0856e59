package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

var pendingCommand = &command{
	name:    "pending",
	args:    "<topic-or-stream> <group>",
	summary: "list a group's pending entries: consumer, idle, deliveries, UUID",
	help: `Lists the entries of <group> that were delivered and not acknowledged, oldest
first: the entry id, the consumer holding it, IDLE (since it was last
delivered or claimed), DELIVERIES (the server's delivery count) and the
message UUID. An entry whose body was trimmed or deleted shows UUID
"(deleted)": the subscriber acknowledges such entries when it meets them.

Filters narrow the list: --consumer, --min-idle (for example 5m for entries
stuck for five minutes) and --min-count (for example 3 for entries that
failed at least twice).`,
	nargs: [2]int{2, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		consumer := fs.String("consumer", "", "only entries held by this `consumer`")
		minIdle := fs.Duration("min-idle", 0, "only entries idle at least this long")
		minCount := fs.Int64("min-count", 0, "only entries delivered at least this many times")
		limit := fs.Int("limit", 100, "list at most this many entries")
		return func(ctx context.Context, e *env, args []string) error {
			if *limit < 1 {
				return usagef("--limit is %d: it must be at least 1", *limit)
			}
			if *minIdle < 0 || *minCount < 0 {
				return usagef("--min-idle and --min-count cannot be negative")
			}
			s := e.stream(args[0])
			e.noteStream(s)
			return listPending(ctx, e, s.Key, args[1], pendingFilter{*consumer, *minIdle, *minCount}, *limit)
		}
	},
}

type pendingFilter struct {
	consumer string
	minIdle  time.Duration
	minCount int64
}

type pendingEntry struct {
	ID         string `json:"id"`
	Time       string `json:"time"`
	Consumer   string `json:"consumer"`
	IdleMS     int64  `json:"idle_ms"`
	Deliveries int64  `json:"deliveries"`
	UUID       string `json:"uuid"`
	Deleted    bool   `json:"deleted"`
}

// pendingPage is how many pending entries one XPENDING call reads.
const pendingPage = 500

func listPending(ctx context.Context, e *env, stream, group string, f pendingFilter, limit int) error {
	if _, err := e.group(ctx, stream, group); err != nil {
		return err
	}
	var found []redis.XPendingExt
	start := "-"
	for len(found) < limit {
		page, err := e.client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: group, Idle: f.minIdle, Start: start, End: "+",
			Count: pendingPage, Consumer: f.consumer,
		}).Result()
		if err != nil {
			return e.serverErr(fmt.Sprintf("reading the pending entries of group %q of stream %q", group, stream), err)
		}
		for _, p := range page {
			if p.RetryCount >= f.minCount && len(found) < limit {
				found = append(found, p)
			}
		}
		if len(page) < pendingPage {
			break
		}
		start = "(" + page[len(page)-1].ID
	}

	entries := make([]pendingEntry, len(found))
	bodies := make([]*redis.XMessageSliceCmd, len(found))
	pipe := e.client.Pipeline()
	for i, p := range found {
		bodies[i] = pipe.XRange(ctx, stream, p.ID, p.ID)
	}
	if len(found) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return e.serverErr(fmt.Sprintf("reading the pending entries of stream %q", stream), err)
		}
	}
	for i, p := range found {
		pe := pendingEntry{ID: p.ID, Time: timeText(idTime(p.ID)), Consumer: p.Consumer, IdleMS: ms(p.Idle), Deliveries: p.RetryCount}
		if msgs := bodies[i].Val(); len(msgs) == 0 {
			pe.Deleted = true
		} else {
			pe.UUID = fieldText(msgs[0].Values[valkeystream.FieldUUID])
		}
		entries[i] = pe
	}

	if e.json {
		return e.printJSON(entries)
	}
	t := e.table("ID", "CONSUMER", "IDLE", "DELIVERIES", "UUID")
	for _, pe := range entries {
		uuid := dash(pe.UUID)
		if pe.Deleted {
			uuid = "(deleted)"
		}
		t.row(pe.ID, pe.Consumer, ageText(time.Duration(pe.IdleMS)*time.Millisecond), strconv.FormatInt(pe.Deliveries, 10), uuid)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(entries) == 0 {
		e.note("no pending entries match")
	} else if len(entries) == limit {
		e.note("showing the first %d; raise --limit for more", limit)
	}
	return nil
}

// fieldText returns an entry field's value as text.
func fieldText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}
