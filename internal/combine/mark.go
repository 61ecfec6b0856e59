package combine

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// markSource is the script of an XADD made idempotent by a mark key: when
// the mark exists, the message was added before and the script returns the
// id it got, adding nothing; otherwise it adds the message and sets the
// mark to its id, expiring after the window. Both happen in one atomic
// step, and both replicate together, so a mark never outlives or precedes
// its entry.
//
// KEYS[1] the mark, KEYS[2] the stream. ARGV[1] the window in
// milliseconds, ARGV[2] the trimming mode ("ACKED" or ""), ARGV[3]
// "MAXLEN", "MINID" or "" (no trimming) and ARGV[4] its value (trimmed
// approximately), ARGV[5...] the entry's fields and values.
const markSource = `
local id = redis.call('GET', KEYS[1])
if id then
  return id
end
local args = {KEYS[2]}
if ARGV[2] ~= '' then
  args[#args + 1] = ARGV[2]
end
if ARGV[3] ~= '' then
  args[#args + 1] = ARGV[3]
  args[#args + 1] = '~'
  args[#args + 1] = ARGV[4]
end
args[#args + 1] = '*'
for i = 5, #ARGV do
  args[#args + 1] = ARGV[i]
end
id = redis.call('XADD', unpack(args))
redis.call('SET', KEYS[1], id, 'PX', ARGV[1])
return id
`

// MarkScript is the script that makes a Request's XADDs idempotent where
// the server has no XADD ... IDMP (see Request.Marks). Its reply is the
// entry's id, the new one or the one stored before.
var MarkScript = redis.NewScript(markSource)

// markedAdd returns the call of MarkScript that adds a under mark, by EVAL
// when eval, else by EVALSHA.
func markedAdd(ctx context.Context, a *redis.XAddArgs, mark string, ttl int64, eval bool) *redis.StringCmd {
	values, _ := a.Values.([]any)
	args := make([]any, 0, 11+len(values))
	if eval {
		args = append(args, "eval", markSource)
	} else {
		args = append(args, "evalsha", MarkScript.Hash())
	}
	args = append(args, 2, mark, a.Stream, ttl, a.Mode)
	switch {
	case a.MaxLen > 0:
		args = append(args, "MAXLEN", a.MaxLen)
	case a.MinID != "":
		args = append(args, "MINID", a.MinID)
	default:
		args = append(args, "", "")
	}
	args = append(args, values...)
	return redis.NewStringCmd(ctx, args...)
}
