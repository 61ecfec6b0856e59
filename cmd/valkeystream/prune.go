package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var pruneCommand = &command{
	name:    "prune",
	args:    "<topic-or-stream> <group>",
	summary: "remove consumers that hold no pending entries and are idle past an age",
	help: `Removes from <group> the consumers that hold no pending entries and have been
idle for at least --idle (XGROUP DELCONSUMER). A consumer that holds pending
entries is never removed: deleting it would delete its pending entries, and
with them the record that they were never handled.

Each removal runs in a server-side script that checks again, at that
instant, that the consumer holds nothing and is still idle long enough, so a
consumer that came back meanwhile is kept. A running subscriber whose
consumer is removed is not harmed: its next read creates it again.

Asks for confirmation unless --yes; --dry-run lists the candidates only.`,
	nargs: [2]int{2, 2},
	setup: func(fs *flagSet) func(context.Context, *env, []string) error {
		idle := fs.Duration("idle", 0, "remove consumers idle at least this long, e.g. 24h (required)")
		dry := fs.Bool("dry-run", false, "list the consumers that would be removed; change nothing")
		yes := fs.Bool("yes", false, "do not ask for confirmation")
		return func(ctx context.Context, e *env, args []string) error {
			if *idle <= 0 {
				return usagef("--idle is required: how long a consumer must have been idle to be removed, e.g. --idle 24h")
			}
			s := e.stream(args[0])
			e.noteStream(s)
			return prune(ctx, e, s.Key, args[1], *idle, *dry, *yes)
		}
	},
}

// pruneScript removes consumer ARGV[2] of group ARGV[1] of stream KEYS[1]
// if it holds no pending entries and has been idle at least ARGV[3]
// milliseconds. It returns 1 when it removed the consumer, 0 when it was
// gone already, -1 when it holds pending entries, -2 when it is not idle
// long enough.
var pruneScript = redis.NewScript(`
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then
	return -1
end
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, c in ipairs(consumers) do
	local name, idle
	for i = 1, #c, 2 do
		if c[i] == 'name' then name = c[i + 1] end
		if c[i] == 'idle' then idle = c[i + 1] end
	end
	if name == ARGV[2] then
		if idle < tonumber(ARGV[3]) then
			return -2
		end
		redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
		return 1
	end
end
return 0
`)

type pruneResult struct {
	Consumer string `json:"consumer"`
	IdleMS   int64  `json:"idle_ms"`
	Result   string `json:"result"` // removed, would-remove, kept-pending, kept-active, gone
}

func prune(ctx context.Context, e *env, stream, group string, minIdle time.Duration, dry, yes bool) error {
	if _, err := e.group(ctx, stream, group); err != nil {
		return err
	}
	consumers, err := e.client.XInfoConsumers(ctx, stream, group).Result()
	if err != nil {
		return e.serverErr(fmt.Sprintf("reading the consumers of group %q of stream %q", group, stream), err)
	}
	var results []pruneResult
	kept := 0
	for _, c := range consumers {
		if c.Pending == 0 && c.Idle >= minIdle {
			results = append(results, pruneResult{Consumer: c.Name, IdleMS: ms(c.Idle)})
		} else {
			kept++
		}
	}
	if len(results) == 0 {
		e.note("no consumer of group %q of %q is idle for %s with nothing pending (%d kept); nothing to remove", group, stream, minIdle, kept)
		if e.json {
			return e.printJSON([]pruneResult{})
		}
		return nil
	}
	if dry {
		for i := range results {
			results[i].Result = "would-remove"
		}
		e.note("dry run: nothing was changed")
		return printPrune(e, results)
	}
	if err := e.confirm(yes, fmt.Sprintf("Remove %d consumers from group %s of %s?", len(results), group, stream)); err != nil {
		return err
	}
	for i := range results {
		r := &results[i]
		n, err := pruneScript.Run(ctx, e.client, []string{stream}, group, r.Consumer, ms(minIdle)).Int64()
		if err != nil {
			_ = printPrune(e, results[:i])
			return e.serverErr(fmt.Sprintf("removing consumer %q from group %q of %q", r.Consumer, group, stream), err)
		}
		r.Result = map[int64]string{1: "removed", 0: "gone", -1: "kept-pending", -2: "kept-active"}[n]
	}
	return printPrune(e, results)
}

func printPrune(e *env, results []pruneResult) error {
	if e.json {
		return e.printJSON(results)
	}
	t := e.table("CONSUMER", "IDLE", "RESULT")
	for _, r := range results {
		t.row(r.Consumer, ageText(time.Duration(r.IdleMS)*time.Millisecond), r.Result)
	}
	return t.flush()
}
