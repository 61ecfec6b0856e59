package valkeystream

import "github.com/redis/go-redis/v9"

// Server-side scripts for the steps that must check who holds an entry and
// act on it in one atomic step. Each touches one stream key, so they run on
// a cluster as well. A failed XPENDING (NOGROUP when the group or the stream
// is gone) is returned as the server's own error reply, so that the client
// sees the same reply prefix on every server version.

// renewScript keeps this consumer's hold on entries it holds (fetched but
// not yet handled, or in a handler's hands). For each id it returns:
//   - the delivery count, after resetting the entry's idle time with
//     XCLAIM ... JUSTID (which leaves the count alone), when the entry is
//     pending for ARGV[2] and still in the stream;
//   - -1 when it is pending for ARGV[2] but its body is gone from the stream
//     (it is left pending, for the caller to acknowledge);
//   - 0 when it is not pending for ARGV[2] any more.
//
// KEYS[1] stream, ARGV[1] group, ARGV[2] consumer, ARGV[3...] ids.
var renewScript = redis.NewScript(`
local out = {}
for i = 3, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if p.err then
    return p
  end
  if #p == 0 then
    out[#out + 1] = 0
  elseif #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i]) == 0 then
    out[#out + 1] = -1
  else
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    out[#out + 1] = p[1][4]
  end
end
return out
`)

// claimBackScript claims a Nacked entry again for the consumer that Nacked
// it, which grows its delivery count, unless another consumer has taken it
// over meanwhile. It returns {"ok", count, fields}, or {"gone"} when the entry
// is not pending (it was acknowledged elsewhere), {"taken"} when another
// consumer holds it, {"missing"} when its body was trimmed or deleted (it is
// left pending, for the caller to acknowledge). Redis 7 and Valkey answer XCLAIM of such an entry with
// nothing; Redis 6.2 with a null element or an entry without fields.
//
// It is idempotent, because a client may send it again after a network
// error that hid a reply: it claims only while the entry's count is still
// ARGV[4], that of the Nacked delivery; a higher count means an earlier run
// of the same call claimed it already, and it answers as that run did.
//
// KEYS[1] stream, ARGV[1] group, ARGV[2] consumer, ARGV[3] id, ARGV[4] the
// delivery count of the Nacked delivery.
var claimBackScript = redis.NewScript(`
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p.err then
  return p
end
if #p == 0 then
  return {'gone'}
end
if p[1][2] ~= ARGV[2] then
  return {'taken'}
end
if p[1][4] > tonumber(ARGV[4]) then
  local r = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
  if #r == 0 then
    return {'missing'}
  end
  return {'ok', p[1][4], r[1][2]}
end
local c = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
if #c == 0 or not c[1] or not c[1][2] then
  return {'missing'}
end
local q = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
return {'ok', q[1][4], c[1][2]}
`)
