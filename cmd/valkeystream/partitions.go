package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/partition"
)

var partitionsCommand = &command{
	name:    "partitions",
	args:    "<topic-or-stream> [<group>]",
	summary: "show a partitioned topic's partitions: stream, slot, length; with a group, owner, lag, pending",
	help: `Shows the partitions of a partitioned topic (see docs/partitions.md): the
partition count declared on the server, and for each partition its stream
key, cluster hash slot and length.

With <group>, also the group's live members (subscriptions, by consumer
name) and, for each partition, its owner ("<member>:<epoch>", the epoch
growing on every change of owner), how long the ownership lives without
renewal, the group's lag and pending entries. A partition without an owner
waits for a member's next beat (a member that died: until its ownership
lapses).`,
	nargs: [2]int{1, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			s := e.stream(args[0])
			e.noteStream(s)
			group := ""
			if len(args) == 2 {
				group = args[1]
			}
			return showPartitions(ctx, e, s, group)
		}
	},
}

type partitionsInfo struct {
	Stream     string          `json:"stream"`
	Topic      string          `json:"topic"`
	Partitions int             `json:"partitions"`
	Group      string          `json:"group,omitempty"`
	Members    []string        `json:"members,omitempty"`
	List       []partitionInfo `json:"list"`
}

type partitionInfo struct {
	Index   int    `json:"index"`
	Stream  string `json:"stream"`
	Slot    int    `json:"slot"`
	Length  int64  `json:"length"`
	Owner   string `json:"owner,omitempty"`
	OwnerMS int64  `json:"owner_ttl_ms,omitempty"`
	Lag     *int64 `json:"lag,omitempty"`
	Pending *int64 `json:"pending,omitempty"`
}

func showPartitions(ctx context.Context, e *env, s stream, group string) error {
	key := partition.DeclarationKey(s.Key)
	declared, err := e.client.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("topic %s is not partitioned: %q holds no partition count (a Publisher or Subscriber with Partitions writes it)", s, key)
	}
	if err != nil {
		return e.serverErr("reading the partition count in "+strconv.Quote(key), err)
	}
	n, err := strconv.Atoi(declared)
	if err != nil {
		return fmt.Errorf("%q holds %q, not a partition count", key, declared)
	}
	l, err := partition.NewLayout(s.Key, n)
	if err != nil {
		return err
	}
	info := partitionsInfo{Stream: s.Key, Topic: s.Topic, Partitions: n, Group: group, List: make([]partitionInfo, n)}
	if group != "" {
		if info.Members, err = partition.NewMembers(e.client, l.MembersKey(group)).List(ctx); err != nil {
			return e.serverErr("reading the members of group "+strconv.Quote(group), err)
		}
	}
	// One pipeline for all of it: on a cluster, go-redis sends each node
	// its share.
	pipe := e.client.Pipeline()
	lens := make([]*redis.IntCmd, n)
	owners := make([]*redis.StringCmd, n)
	ttls := make([]*redis.DurationCmd, n)
	groups := make([]*redis.XInfoGroupsCmd, n)
	for i := range n {
		lens[i] = pipe.XLen(ctx, l.Stream(i))
		if group != "" {
			keys := l.Keys(i, group)
			owners[i] = pipe.Get(ctx, keys.Owner)
			ttls[i] = pipe.PTTL(ctx, keys.Owner)
			groups[i] = pipe.XInfoGroups(ctx, l.Stream(i))
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i := range n {
		p := partitionInfo{Index: i, Stream: l.Stream(i), Slot: l.Slot(i), Length: lens[i].Val()}
		if err := lens[i].Err(); err != nil {
			return e.serverErr("reading the length of "+strconv.Quote(p.Stream), err)
		}
		if group != "" {
			p.Owner = owners[i].Val()
			if p.Owner != "" {
				p.OwnerMS = ttls[i].Val().Milliseconds()
			}
			for _, g := range groups[i].Val() {
				if g.Name == group {
					gi := toGroupInfo(p.Stream, g)
					if !e.reportsLag(ctx) {
						gi.Lag = nil
					}
					p.Lag, p.Pending = gi.Lag, &gi.Pending
				}
			}
		}
		info.List[i] = p
	}
	if e.json {
		return e.printJSON(info)
	}
	fmt.Fprintf(e.stdout, "topic %s: %d partitions (declared in %s)\n", s.Topic, n, key)
	if group != "" {
		members := strings.Join(info.Members, ", ")
		if members == "" {
			members = "none"
		}
		fmt.Fprintf(e.stdout, "group %s: members %s\n", group, members)
	}
	fmt.Fprintln(e.stdout)
	header := []string{"PARTITION", "STREAM", "SLOT", "LENGTH"}
	if group != "" {
		header = append(header, "OWNER", "OWNER TTL", "LAG", "PENDING")
	}
	t := e.table(header...)
	for _, p := range info.List {
		row := []string{strconv.Itoa(p.Index), p.Stream, strconv.Itoa(p.Slot), strconv.FormatInt(p.Length, 10)}
		if group != "" {
			owner, ttl := "-", "-"
			if p.Owner != "" {
				owner, ttl = p.Owner, ageText(time.Duration(p.OwnerMS)*time.Millisecond)
			}
			pending := "-"
			if p.Pending != nil {
				pending = strconv.FormatInt(*p.Pending, 10)
			}
			row = append(row, owner, ttl, lagText(p.Lag), pending)
		}
		t.row(row...)
	}
	return t.flush()
}

var partitionsDeclareCommand = &command{
	name:    "partitions declare",
	args:    "<topic-or-stream> <n>",
	summary: "declare a topic partitioned with n partitions, for every Publisher and Subscriber to find",
	help: `Declares a topic partitioned with n partitions (1 to 1024; see
docs/partitions.md): it writes the count to the server, where every
Publisher and Subscriber finds it at its first use of the topic, so that
none of them needs the count in its config. Declaring the count a topic has
already changes nothing; another count is refused, naming both (changing
the count is a migration).

A topic in use as a plain one (its stream holds entries or consumer
groups) is refused: its new messages would go to the partitions while its
running subscriptions read the plain stream. Declare a topic before its
first Publisher or Subscriber starts.`,
	nargs: [2]int{2, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 || n > partition.MaxPartitions {
				return usagef("the partition count %q is not a number from 1 to %d", args[1], partition.MaxPartitions)
			}
			s := e.stream(args[0])
			e.noteStream(s)
			return declarePartitions(ctx, e, s, n)
		}
	},
}

type declareResult struct {
	Stream     string `json:"stream"`
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	Key        string `json:"key"`
	Result     string `json:"result"` // declared, already-declared
}

func declarePartitions(ctx context.Context, e *env, s stream, n int) error {
	l, err := partition.NewLayout(s.Key, n)
	if err != nil {
		return err
	}
	key := partition.DeclarationKey(s.Key)
	r := declareResult{Stream: s.Key, Topic: s.Topic, Partitions: n, Key: key, Result: "declared"}
	switch before, err := e.client.Get(ctx, key).Result(); {
	case errors.Is(err, redis.Nil):
		if err := refusePlainUse(ctx, e, s); err != nil {
			return err
		}
	case err != nil:
		return e.serverErr("reading the partition count in "+strconv.Quote(key), err)
	case before == strconv.Itoa(n):
		r.Result = "already-declared"
	}
	var mismatch *partition.CountMismatchError
	switch err := l.Declare(ctx, e.client); {
	case errors.As(err, &mismatch):
		return fmt.Errorf("topic %s is declared with %d partitions on the server (key %q), not %d: changing the count is a migration (docs/partitions.md)",
			s, mismatch.Declared, key, n)
	case err != nil:
		return e.serverErr("declaring the partition count in "+strconv.Quote(key), err)
	}
	if e.json {
		return e.printJSON(r)
	}
	t := e.table("STREAM", "TOPIC", "PARTITIONS", "KEY", "RESULT")
	t.row(r.Stream, r.Topic, strconv.Itoa(r.Partitions), r.Key, r.Result)
	return t.flush()
}

// refusePlainUse returns an error when the stream of s holds entries or
// consumer groups: the topic is in use as a plain one.
func refusePlainUse(ctx context.Context, e *env, s stream) error {
	typ, err := e.client.Type(ctx, s.Key).Result()
	if err != nil {
		return e.serverErr("reading the type of "+strconv.Quote(s.Key), err)
	}
	switch typ {
	case "none":
		return nil
	case "stream":
	default:
		return fmt.Errorf("key %q holds a %s, not a stream: topic %s cannot be declared partitioned", s.Key, typ, s)
	}
	length, err := e.client.XLen(ctx, s.Key).Result()
	if err != nil {
		return e.serverErr("reading the length of "+strconv.Quote(s.Key), err)
	}
	groups, err := e.client.XInfoGroups(ctx, s.Key).Result()
	if err != nil {
		return e.serverErr("reading the groups of "+strconv.Quote(s.Key), err)
	}
	if length > 0 || len(groups) > 0 {
		return fmt.Errorf("topic %s is in use as a plain topic (its stream holds %d entries and %d consumer groups): declared partitioned, its new messages would go to the partitions while its running subscriptions read the plain stream; that is a migration (docs/partitions.md)",
			s, length, len(groups))
	}
	return nil
}
