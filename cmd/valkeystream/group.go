package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/serverinfo"
)

var groupCommand = &command{
	name:    "group",
	args:    "<topic-or-stream> [<group>]",
	summary: "show a stream's groups, or one group: lag, pending, consumers",
	help: `Without <group>, lists the consumer groups of <stream> with their consumers,
pending entries, lag and last delivered id.

With <group>, shows the group and its consumers. LAG is how many entries of
the stream the group has not read yet (the server's count; "-" when the
server cannot tell, after deletions). PENDING is how many entries were read
and not acknowledged: entries being handled, read ahead, or stuck. For each
consumer: its pending entries, IDLE (since its last read or claim) and
INACTIVE (since its last successful read; not reported by Redis 7.0).`,
	nargs: [2]int{1, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			s := e.stream(args[0])
			e.noteStream(s)
			if len(args) == 1 {
				return listGroups(ctx, e, s.Key)
			}
			return showGroup(ctx, e, s.Key, args[1])
		}
	},
}

type groupInfo struct {
	Stream          string         `json:"stream"`
	Topic           string         `json:"topic"`
	Group           string         `json:"group"`
	Consumers       int64          `json:"consumers"`
	Pending         int64          `json:"pending"`
	Lag             *int64         `json:"lag"` // null when the server cannot tell
	LastDeliveredID string         `json:"last_delivered_id"`
	EntriesRead     int64          `json:"entries_read"`
	OldestPendingID string         `json:"oldest_pending_id,omitempty"`
	OldestPendingAt string         `json:"oldest_pending_time,omitempty"`
	ConsumerList    []consumerInfo `json:"consumer_list,omitempty"`
}

type consumerInfo struct {
	Name       string `json:"name"`
	Pending    int64  `json:"pending"`
	IdleMS     int64  `json:"idle_ms"`
	InactiveMS *int64 `json:"inactive_ms"` // null when the server does not report it
}

func toGroupInfo(stream string, g redis.XInfoGroup) groupInfo {
	gi := groupInfo{Stream: stream, Group: g.Name, Consumers: g.Consumers, Pending: g.Pending,
		LastDeliveredID: g.LastDeliveredID, EntriesRead: g.EntriesRead}
	if g.Lag >= 0 {
		lag := g.Lag
		gi.Lag = &lag
	}
	return gi
}

func lagText(l *int64) string {
	if l == nil {
		return "-"
	}
	return strconv.FormatInt(*l, 10)
}

func (e *env) groups(ctx context.Context, stream string) ([]redis.XInfoGroup, error) {
	groups, err := e.client.XInfoGroups(ctx, stream).Result()
	if redis.HasErrorPrefix(err, "no such key") {
		return nil, e.noStream(stream)
	}
	if err != nil {
		return nil, e.serverErr("reading the groups of stream "+strconv.Quote(stream), err)
	}
	if !e.reportsLag(ctx) {
		// The reply has no lag (before Redis 7.0), which go-redis reads as 0.
		for i := range groups {
			groups[i].Lag = -1
		}
	}
	return groups, nil
}

// reportsLag reports whether the server's XINFO GROUPS has the groups' lag:
// Redis 7.0 and later, and every Valkey (which reports a redis_version of 7.2).
func (e *env) reportsLag(ctx context.Context) bool {
	if e.lagKnown == nil {
		info, err := e.client.Info(ctx, "server").Result()
		known := err != nil || serverinfo.ReportsLag(info) // on doubt, trust the reply
		e.lagKnown = &known
	}
	return *e.lagKnown
}

func listGroups(ctx context.Context, e *env, stream string) error {
	groups, err := e.groups(ctx, stream)
	if err != nil {
		return err
	}
	infos := make([]groupInfo, 0, len(groups))
	for _, g := range groups {
		infos = append(infos, toGroupInfo(stream, g))
	}
	if e.json {
		return e.printJSON(infos)
	}
	t := e.table("GROUP", "CONSUMERS", "PENDING", "LAG", "LAST DELIVERED")
	for _, g := range infos {
		t.row(g.Group, strconv.FormatInt(g.Consumers, 10), strconv.FormatInt(g.Pending, 10), lagText(g.Lag), g.LastDeliveredID)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(infos) == 0 {
		e.note("stream %q has no consumer groups", stream)
	}
	return nil
}

func showGroup(ctx context.Context, e *env, stream, group string) error {
	gi, err := e.group(ctx, stream, group)
	if err != nil {
		return err
	}
	gi.Topic = e.topicOf(stream)
	consumers, err := e.client.XInfoConsumers(ctx, stream, group).Result()
	if err != nil {
		return e.serverErr(fmt.Sprintf("reading the consumers of group %q of stream %q", group, stream), err)
	}
	if gi.Pending > 0 {
		sum, err := e.client.XPending(ctx, stream, group).Result()
		if err != nil {
			return e.serverErr(fmt.Sprintf("reading the pending summary of group %q of stream %q", group, stream), err)
		}
		gi.OldestPendingID = sum.Lower
		gi.OldestPendingAt = timeText(idTime(sum.Lower))
	}
	gi.ConsumerList = []consumerInfo{}
	for _, c := range consumers {
		ci := consumerInfo{Name: c.Name, Pending: c.Pending, IdleMS: ms(c.Idle)}
		// Redis 7.0 has no "inactive": go-redis leaves it 0, which a
		// server that has it reports only together with an idle of 0.
		if c.Inactive != 0 || c.Idle == 0 {
			in := ms(c.Inactive)
			ci.InactiveMS = &in
		}
		gi.ConsumerList = append(gi.ConsumerList, ci)
	}
	if e.json {
		return e.printJSON(gi)
	}
	t := e.table("STREAM", "TOPIC", "GROUP", "LAG", "PENDING", "CONSUMERS", "LAST DELIVERED", "OLDEST PENDING")
	oldest := "-"
	if gi.OldestPendingID != "" {
		oldest = gi.OldestPendingID + " (" + ageText(time.Since(idTime(gi.OldestPendingID))) + " old)"
	}
	t.row(stream, gi.Topic, group, lagText(gi.Lag), strconv.FormatInt(gi.Pending, 10), strconv.FormatInt(gi.Consumers, 10), gi.LastDeliveredID, oldest)
	if err := t.flush(); err != nil {
		return err
	}
	if len(gi.ConsumerList) == 0 {
		return nil
	}
	fmt.Fprintln(e.stdout)
	t = e.table("CONSUMER", "PENDING", "IDLE", "INACTIVE")
	for _, c := range gi.ConsumerList {
		inactive := "-"
		if c.InactiveMS != nil && *c.InactiveMS >= 0 {
			inactive = ageText(time.Duration(*c.InactiveMS) * time.Millisecond)
		}
		t.row(c.Name, strconv.FormatInt(c.Pending, 10), ageText(time.Duration(c.IdleMS)*time.Millisecond), inactive)
	}
	return t.flush()
}

// group returns one group of stream, or an error that says it is not there.
func (e *env) group(ctx context.Context, stream, group string) (groupInfo, error) {
	groups, err := e.groups(ctx, stream)
	if err != nil {
		return groupInfo{}, err
	}
	for _, g := range groups {
		if g.Name == group {
			return toGroupInfo(stream, g), nil
		}
	}
	return groupInfo{}, fmt.Errorf("stream %s has no group %q (run \"valkeystream group %s\" to list its groups)", e.named(stream), group, stream)
}
