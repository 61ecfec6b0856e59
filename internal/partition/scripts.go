package partition

import "github.com/redis/go-redis/v9"

// The server-side scripts of partition ownership. Each touches the keys of
// one partition only, all in the partition's slot, so they run on a cluster
// too. Every fenced script takes KEYS[1] the owner record, KEYS[2] the
// partition's stream, ARGV[1] the caller's token "<member>:<epoch>", and
// first checks that the owner record holds the token: otherwise it changes
// nothing and returns {'fenced'}; else its reply is {'ok', ...}. A failed
// stream command (NOGROUP when the group or the stream is gone) is returned
// as the server's own error reply (redis.pcall), so the client sees the same
// reply prefix on every server version. The consumer name in the group is
// the owner's member id.

// acquireScript takes the partition when nobody holds it: it grows the
// epoch counter and writes "<member>:<epoch>" with the TTL, and returns
// {1, epoch}; else {0, holder's record, its PTTL}.
//
// KEYS[1] owner record, KEYS[2] epoch counter, ARGV[1] member, ARGV[2] TTL
// in milliseconds.
var acquireScript = newScript(`
local v = redis.call('GET', KEYS[1])
if v then
  return {0, v, redis.call('PTTL', KEYS[1])}
end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. e, 'PX', ARGV[2])
return {1, e}
`)

// renewScript extends the caller's ownership (1); writes it again if its
// record lapsed and nobody acquired the partition since, which the epoch
// counter, still at the caller's epoch, proves (2); or reports it lost (0).
//
// KEYS[1] owner record, KEYS[2] epoch counter, ARGV[1] token, ARGV[2] TTL in
// milliseconds, ARGV[3] the token's epoch.
var renewScript = newScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
`)

// releaseScript deletes the owner record if it holds the caller's token (1),
// else changes nothing (0). The epoch counter stays.
//
// KEYS[1] owner record, ARGV[1] token.
var releaseScript = newScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// handOverScript moves the group's pending entries, whoever holds them, to
// the owner's consumer name, with XAUTOCLAIM ... 0 ... JUSTID (no idle time
// needed), which leaves each entry's delivery count alone: the owner's read
// of its own pending entries grows it, as the delivery it is. It goes from
// the cursor ARGV[4] until
// the pending list ends or ARGV[5] entries moved. It returns {'ok', next
// cursor ("0-0": the list was scanned to its end), entries moved, ids of
// entries whose bodies are gone and that the server dropped from the list
// (Redis 7 and later; Redis 6.2 moves them like the others)}.
//
// ARGV[2] group, ARGV[3] consumer, ARGV[4] cursor, ARGV[5] most entries.
var handOverScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
local cursor = ARGV[4]
local left = tonumber(ARGV[5])
local moved = 0
local deleted = {}
repeat
  local r = redis.pcall('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, cursor, 'COUNT', math.min(left, 100), 'JUSTID')
  if r.err then
    return r
  end
  cursor = r[1]
  moved = moved + #r[2]
  left = left - #r[2]
  if r[3] then
    for _, id in ipairs(r[3]) do
      deleted[#deleted + 1] = id
    end
  end
until cursor == '0-0' or left <= 0
return {'ok', cursor, moved, deleted}
`)

// readScript reads with XREADGROUP, without blocking: new entries (ARGV[5]
// ">") or the owner's own pending entries after an id. It returns {'ok',
// the XREADGROUP reply}; when a read of new entries brought none, {'ok',
// nil, the id of the stream's last entry ("0-0": none)}: every entry added
// later has a greater id, which a plain XREAD BLOCK waits for.
//
// ARGV[2] group, ARGV[3] consumer, ARGV[4] count, ARGV[5] id.
var readScript = newScript(readSource)

const readSource = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[2], ARGV[5])
if type(r) == 'table' and r.err then
  return r
end
if not r and ARGV[5] == '>' then
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  return {'ok', false, top[1] and top[1][1] or '0-0'}
end
return {'ok', r}
`

// ackScript acknowledges entries, and returns {'ok', how many were
// pending}.
//
// ARGV[2] group, ARGV[3...] ids.
var ackScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
local n = 0
for i = 3, #ARGV, 500 do
  local r = redis.pcall('XACK', KEYS[2], ARGV[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
  if type(r) == 'table' and r.err then
    return r
  end
  n = n + r
end
return {'ok', n}
`)

// holdScript is the loop's hold call (internal/loop's holdScript), fenced:
// for each id, the delivery count after resetting its idle time (XCLAIM
// ... JUSTID) when it is pending for the owner and in the stream, -1 when
// it is pending but its body is gone, 0 when it is not pending for the
// owner. It returns {'ok', counts}.
//
// ARGV[2] group, ARGV[3] consumer, ARGV[4...] ids.
var holdScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
local out = {}
for i = 4, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[2], ARGV[2], ARGV[i], ARGV[i], 1, ARGV[3])
  if p.err then
    return p
  end
  if #p == 0 then
    out[#out + 1] = 0
  elseif #redis.call('XRANGE', KEYS[2], ARGV[i], ARGV[i]) == 0 then
    out[#out + 1] = -1
  else
    redis.call('XCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[i], 'JUSTID')
    out[#out + 1] = p[1][4]
  end
end
return {'ok', out}
`)

// claimBackScript is the loop's Nack claim (internal/loop's
// claimBackScript), fenced: it claims a Nacked entry again for the owner,
// which grows its delivery count, while the count is still ARGV[5]. It
// returns {'ok', 'ok', count, fields}, or {'ok', 'gone'}, {'ok', 'taken'},
// {'ok', 'missing'} (see loop.ClaimedBack).
//
// ARGV[2] group, ARGV[3] consumer, ARGV[4] id, ARGV[5] the delivery count
// of the Nacked delivery.
var claimBackScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
local p = redis.pcall('XPENDING', KEYS[2], ARGV[2], ARGV[4], ARGV[4], 1)
if p.err then
  return p
end
if #p == 0 then
  return {'ok', 'gone'}
end
if p[1][2] ~= ARGV[3] then
  return {'ok', 'taken'}
end
if p[1][4] > tonumber(ARGV[5]) then
  local r = redis.call('XRANGE', KEYS[2], ARGV[4], ARGV[4])
  if #r == 0 then
    return {'ok', 'missing'}
  end
  return {'ok', 'ok', p[1][4], r[1][2]}
end
local c = redis.call('XCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[4])
if #c == 0 or not c[1] or not c[1][2] then
  return {'ok', 'missing'}
end
local q = redis.call('XPENDING', KEYS[2], ARGV[2], ARGV[4], ARGV[4], 1)
return {'ok', 'ok', q[1][4], c[1][2]}
`)

// handBackScript hands entries back on the owner's own name with XCLAIM
// ... IDLE ... JUSTID, which leaves their delivery counts alone. It returns
// {'ok'}.
//
// ARGV[2] group, ARGV[3] consumer, ARGV[4] idle time in milliseconds,
// ARGV[5...] ids.
var handBackScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
for i = 5, #ARGV do
  local r = redis.pcall('XCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[i], 'IDLE', ARGV[4], 'JUSTID')
  if r.err then
    return r
  end
end
return {'ok'}
`)

// sources are the bodies of the scripts, for an EVAL after NOSCRIPT.
var sources = map[*redis.Script]string{}

// newScript returns the script of body src, with its body kept.
// pruneScript removes from the group the consumers other than the owner
// that hold nothing pending: the names of owners gone by, which a hand-over
// left empty. It returns {'ok', how many it removed}.
//
// ARGV[2] group, ARGV[3] the owner's consumer name.
var pruneScript = newScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'fenced'}
end
local cs = redis.pcall('XINFO', 'CONSUMERS', KEYS[2], ARGV[2])
if cs.err then
  return cs
end
local removed = 0
for _, c in ipairs(cs) do
  local name, pending
  for i = 1, #c, 2 do
    if c[i] == 'name' then
      name = c[i + 1]
    elseif c[i] == 'pending' then
      pending = c[i + 1]
    end
  end
  if name and name ~= ARGV[3] and pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], name)
    removed = removed + 1
  end
end
return {'ok', removed}
`)

func newScript(src string) *redis.Script {
	s := redis.NewScript(src)
	sources[s] = src
	return s
}

// sourceOf returns the body of s.
func sourceOf(s *redis.Script) string { return sources[s] }
