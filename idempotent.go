package valkeystream

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Idempotent publishing (PublisherConfig.IdempotentWindow). A message
// published again with the same UUID within the window is stored once: the
// Publish of the copy succeeds and adds nothing. Where the server has
// XADD ... IDMP (Redis 8.6), the server remembers the UUIDs, per producer
// id, in the stream itself; elsewhere a script keeps a mark key per UUID
// beside the stream, in its cluster slot, that holds the entry's id until
// the window ends. See docs/design.md#publishing.

// MaxIdempotentWindow is the longest PublisherConfig.IdempotentWindow: the
// longest time Redis' IDMP-DURATION allows.
const MaxIdempotentWindow = 24 * time.Hour

// idempotentProducers is how many IDMP producer ids a Publisher spreads
// UUIDs over, and idempotentPerProducer how many ids the server remembers
// per producer (the most IDMP-MAXSIZE allows): a message's retry is caught
// while its UUID is among the last idempotentPerProducer of its producer
// and within the window.
const (
	idempotentProducers   = 16
	idempotentPerProducer = 10000
)

// producerIDs are the IDMP producer ids, "valkeystream-0" to
// "valkeystream-f".
var producerIDs = func() (ids [idempotentProducers]string) {
	for i := range ids {
		ids[i] = fmt.Sprintf("valkeystream-%x", i)
	}
	return ids
}()

// idempotentProducer returns the IDMP producer id of a message UUID: the
// low four bits of the UUID's 32-bit FNV-1a hash pick one of producerIDs.
// Every Publisher picks the same one for a UUID, so a copy published by
// another process is caught too.
func idempotentProducer(uuid string) string {
	// hash/fnv's New32a, without its allocation per message.
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(uuid); i++ {
		h ^= uint32(uuid[i])
		h *= prime32
	}
	return producerIDs[h%idempotentProducers]
}

// idempotencyMarkKey returns the key of the mark that remembers message
// uuid of stream streamKey on the script path. It lies in the stream's
// cluster slot, by the rule of [DelayedKey]: streamKey + ".idmp:" + uuid
// when streamKey has a hash tag, else "{" + streamKey + "}:idmp:" + uuid.
func idempotencyMarkKey(streamKey, uuid string) (string, error) {
	if hasHashTag(streamKey) {
		return streamKey + ".idmp:" + uuid, nil
	}
	tagged, err := slotTag(streamKey)
	if err != nil {
		return "", fmt.Errorf("%w: idempotent publishing on this server keeps a key per message beside the stream, which needs a topic without '}' or with a hash tag such as {orders}", err)
	}
	return tagged + ":idmp:" + uuid, nil
}

// idempotentWindowSeconds is window in whole seconds, rounded up: the
// stream's IDMP-DURATION.
func idempotentWindowSeconds(window time.Duration) int64 {
	return int64(math.Ceil(window.Seconds()))
}

// windowScript makes sure a stream has the Publisher's IDMP settings: it
// creates a missing stream, empty (a group created with MKSTREAM and
// destroyed in the same atomic step, so no group is ever seen and no entry
// added), then sets IDMP-DURATION and IDMP-MAXSIZE. Setting the values a
// stream already has keeps the UUIDs it remembers; other values make the
// server forget them.
//
// KEYS[1] the stream. ARGV[1] the duration in seconds, ARGV[2] the
// maximum per producer, ARGV[3] a group name not in use.
var windowScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[3], '$', 'MKSTREAM')
  redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[3])
end
return redis.call('XCFGSET', KEYS[1], 'IDMP-DURATION', ARGV[1], 'IDMP-MAXSIZE', ARGV[2])
`)

// windowGroup names the group windowScript creates and destroys at once.
const windowGroup = "valkeystream-idmp-setup"

// idempotency is a Publisher's state of idempotent publishing: the streams
// whose IDMP settings it has applied.
type idempotency struct {
	window time.Duration // 0: off

	mu         sync.Mutex
	configured map[string]bool // stream keys
}

// configure applies the window to the stream key, once per key (again
// after forget), before its first XADD ... IDMP.
func (d *idempotency) configure(ctx context.Context, client redis.UniversalClient, key string) error {
	d.mu.Lock()
	done := d.configured[key]
	d.mu.Unlock()
	if done {
		return nil
	}
	// Calls racing here all run the script: setting the same values twice
	// keeps what the server remembers.
	err := windowScript.Run(ctx, client, []string{key},
		idempotentWindowSeconds(d.window), idempotentPerProducer, windowGroup).Err()
	if err != nil {
		return fmt.Errorf("setting the idempotency window of stream %q (XCFGSET %s IDMP-DURATION %d IDMP-MAXSIZE %d; the user needs +xcfgset, +xgroup|create, +xgroup|destroy, +exists, +evalsha and +eval): %w",
			key, key, idempotentWindowSeconds(d.window), idempotentPerProducer, err)
	}
	d.mu.Lock()
	if d.configured == nil {
		d.configured = make(map[string]bool)
	}
	d.configured[key] = true
	d.mu.Unlock()
	return nil
}

// forget makes configure apply the window again: after a failover the
// client may reach a node that never had it.
func (d *idempotency) forget() {
	d.mu.Lock()
	d.configured = nil
	d.mu.Unlock()
}
