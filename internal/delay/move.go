package delay

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// moveBatch is the most delayed messages one move of a stream appends.
const moveBatch = 100

// movesPerCall is the most streams one call of moveScript moves, so that
// one call never holds the server long.
const movesPerCall = 200

// moveScript appends to each stream up to ARGV[1] delayed entries whose due
// time has come by the server's clock, earliest first, removing each from
// its sorted set in the same atomic step. KEYS holds pairs (sorted set,
// stream). It returns, by pair, how many it moved, or the error reply that
// stopped that pair's move (a string); the other pairs go on.
var moveScript = redis.NewScript(DecodeEntryLua + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS, 2 do
  local due = redis.pcall('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
  if due.err then
    out[#out + 1] = due.err
  else
    local n = 0
    for _, m in ipairs(due) do
      local r = redis.pcall('XADD', KEYS[i + 1], '*', unpack(fields(m)))
      if type(r) == 'table' and r.err then
        n = r.err
        break
      end
      r = redis.pcall('ZREM', KEYS[i], m)
      if type(r) == 'table' and r.err then
        n = r.err
        break
      end
      n = n + 1
    end
    out[#out + 1] = n
  end
end
return out
`)

// result is the move of one stream: how many messages it moved, or why it
// failed, and whether it, or another stream of its call, had a sorted set
// (or the server could not say).
type result struct {
	moved int
	err   error
	found bool
}

// runMoves moves the due messages of topics through client and returns, by
// topic, how many it moved or why it failed. On a *redis.Client one script
// call moves up to movesPerCall topics; on other clients, whose keys may lie
// in different cluster slots, one call moves one topic. Most topics have no
// delayed messages, and the script costs the server several microseconds
// per topic even then: so one pipeline first asks, with one EXISTS per
// call, which calls have a sorted set at all, and a second one runs the
// script for those only (the calls refused for want of the script are sent
// again with its body, EVAL). A failed EXISTS runs the script, which reports
// the failure.
func runMoves(ctx context.Context, client redis.UniversalClient, topics []*topic) []result {
	perCall := 1
	if _, single := client.(*redis.Client); single {
		perCall = movesPerCall
	}
	var calls [][]*topic
	for from := 0; from < len(topics); from += perCall {
		calls = append(calls, topics[from:min(from+perCall, len(topics))])
	}
	pipe := client.Pipeline()
	exists := make([]*redis.IntCmd, len(calls))
	for i, call := range calls {
		keys := make([]string, len(call))
		for j, t := range call {
			keys[j] = t.keys[0]
		}
		exists[i] = pipe.Exists(ctx, keys...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	var todo []int        // the calls to run
	out := make([]result, len(topics))
	for i, c := range exists {
		if n, err := c.Result(); err != nil || n > 0 {
			todo = append(todo, i)
			for j := range calls[i] {
				out[i*perCall+j].found = true
			}
		}
	}
	// send runs the script for the calls todo and returns those that the
	// server refused for not having it.
	send := func(todo []int, eval bool) (noScript []int) {
		pipe := client.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for i, c := range todo {
			keys := make([]string, 0, 2*len(calls[c]))
			for _, t := range calls[c] {
				keys = append(keys, t.keys...)
			}
			if eval {
				cmds[i] = moveScript.Eval(ctx, pipe, keys, moveBatch)
			} else {
				cmds[i] = moveScript.EvalSha(ctx, pipe, keys, moveBatch)
			}
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		for i, c := range todo {
			if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
				noScript = append(noScript, c)
			}
			for j, r := range parseMoves(cmds[i], len(calls[c])) {
				r.found = true
				out[c*perCall+j] = r
			}
		}
		return noScript
	}
	if len(todo) > 0 {
		if again := send(todo, false); len(again) > 0 {
			// EVAL loads it, with no permission beyond the one to run
			// it; only the calls refused go again (on a cluster, nodes
			// that had the script ran theirs).
			send(again, true)
		}
	}
	return out
}

// parseMoves reads the reply of moveScript for n topics.
func parseMoves(c *redis.Cmd, n int) []result {
	out := make([]result, n)
	reply, err := c.Slice()
	if err == nil && len(reply) != n {
		err = fmt.Errorf("moving delayed messages: %d results for %d topics", len(reply), n)
	}
	for i := range out {
		switch {
		case err != nil:
			out[i].err = err
		default:
			switch v := reply[i].(type) {
			case int64:
				out[i].moved = int(v)
			case string:
				out[i].err = errors.New(v)
			default:
				out[i].err = fmt.Errorf("moving delayed messages: unexpected result %v", v)
			}
		}
	}
	return out
}
