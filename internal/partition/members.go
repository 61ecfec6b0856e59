package partition

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Members is the membership of a consumer group in a partitioned topic: a
// sorted set (see [Layout.MembersKey]) of the group's live subscriptions,
// each scored with the time, in milliseconds of the server's clock, when it
// expires unless it beats again. The clocks of the clients never matter:
// every time is the server's (TIME inside the scripts). Whoever reads the
// set removes the members that expired.
type Members struct {
	client redis.UniversalClient
	key    string
}

// NewMembers returns the membership kept in key, through client.
func NewMembers(client redis.UniversalClient, key string) *Members {
	return &Members{client: client, key: key}
}

// beatScript removes the expired members, adds or renews ARGV[1] (unless
// empty) to expire ARGV[2] milliseconds from now, keeps the set itself no
// longer than its last member, and returns the members.
//
// KEYS[1] the set, ARGV[1] member or "", ARGV[2] TTL in milliseconds.
var beatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], last[2])
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
`)

// Beat records that member is alive for ttl more, and returns the live
// members, member included, in ascending order. Beat at least a few times
// per ttl (a third of it, say) so that a slow beat does not drop a live
// member.
func (m *Members) Beat(ctx context.Context, member string, ttl time.Duration) ([]string, error) {
	if member == "" {
		return nil, fmt.Errorf("partition: an empty member id in %q; give each subscription an id", m.key)
	}
	return m.run(ctx, member, ttl)
}

// List returns the live members in ascending order, removing the expired
// ones.
func (m *Members) List(ctx context.Context) ([]string, error) { return m.run(ctx, "", 0) }

// Leave removes member at once, so that the others move its partitions
// without waiting for it to expire.
func (m *Members) Leave(ctx context.Context, member string) error {
	if err := m.client.ZRem(ctx, m.key, member).Err(); err != nil {
		return fmt.Errorf("partition: removing member %q from %q: %w", member, m.key, err)
	}
	return nil
}

func (m *Members) run(ctx context.Context, member string, ttl time.Duration) ([]string, error) {
	members, err := beatScript.Run(ctx, m.client, []string{m.key}, member, ttl.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("partition: reading the members in %q: %w", m.key, err)
	}
	slices.Sort(members)
	return members, nil
}
