package loop

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/echomq/valkeystream/internal/failover"
)

// newBlockingReader returns the client a group subscription sends its
// blocking reads (XREADGROUP ... BLOCK) through, and whether it is its own
// to close: a client of its own, made from the options of the user's client,
// so that closing it ends a blocked read at once when the subscription ends,
// instead of after BlockTime. It holds one connection (a cluster client, one
// per node it reads from). Commands sent through it skip the hooks added to
// the user's client (AddHook): tracing or metrics hooks do not see the
// blocking reads. Every other command, the non-blocking read that goes with
// the Acks included, uses the user's client. For a client of another type (a
// ring, a wrapper) it is that client itself, and a blocked read ends within
// BlockTime as before.
func newBlockingReader(c redis.UniversalClient, block time.Duration) (reader BlockingReader, own bool) {
	switch c := c.(type) {
	case *redis.Client:
		if failover.IsSentinel(c) {
			// A Sentinel client follows a failover by closing its own
			// connections to the old master: a connection taken from its
			// pool is closed with them, so the read fails at once and the
			// next one goes to the new master (see RedisServer.Block). A
			// client made from a copy of its options would stay on the old
			// master until that is demoted. Closing it does not end a read
			// in progress: at the end of a subscription that read ends
			// within BlockTime.
			return c.EphemeralConn(), false
		}
		opt := OneConnection(c.Options())
		opt.ReadTimeout = BlockingReadTimeout(opt.ReadTimeout, block)
		return redis.NewClient(opt), true
	case *redis.ClusterClient:
		opt := *c.Options()
		opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 1, 0, 1, 0
		opt.ReadTimeout = BlockingReadTimeout(opt.ReadTimeout, block)
		return redis.NewClusterClient(&opt), true
	default:
		return c, false
	}
}

// BlockingReader is what blocking reads go through: a client, or one
// connection of a client's.
type BlockingReader interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	XReadGroup(ctx context.Context, a *redis.XReadGroupArgs) *redis.XStreamSliceCmd
	Close() error
}

// BlockingRead reads up to count new entries of streams (keys, then a ">"
// each) for consumer in group through r, waiting up to block. When r is a
// client of the library's own (own), whose ReadTimeout covers block (see
// BlockingReadTimeout), it is a read the client never sends again after a
// connection error (NewReadOnce): the read fails, and the loop's drain
// delivers what it may have taken. On a client or connection shared with
// the user, it is go-redis' XReadGroup, with go-redis' read timeout for
// blocking reads (the user's ReadTimeout may be shorter than block) and
// its retries.
func BlockingRead(ctx context.Context, r BlockingReader, own bool, a ReadArgs) ([]redis.XStream, error) {
	if own {
		cmd, once := NewReadOnce(ctx, a)
		_ = r.Process(ctx, once)
		return cmd.Result()
	}
	return r.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: a.Group, Consumer: a.Consumer, Streams: a.Streams, Count: a.Count, Block: a.Block, Claim: a.Claim,
	}).Result()
}

// BlockingReadTimeout is the ReadTimeout of a reader of blocking reads of
// up to block, made from a client whose ReadTimeout is timeout: a reply may
// take block and more, as go-redis allows its own blocking reads (block
// plus 10 s). An initialised ReadTimeout of 0 is none, which -1 keeps when
// the options are initialised again.
func BlockingReadTimeout(timeout, block time.Duration) time.Duration {
	switch {
	case timeout == 0:
		return -1
	case timeout > 0:
		return max(timeout, block+10*time.Second)
	}
	return timeout
}

// OneConnection returns a copy of opt for a client of one connection: a
// reader that holds it in blocking reads, made from the user's options.
//
// The copy shares neither the user's MaintNotificationsConfig nor the
// push notification processor that go-redis put into the user's options:
// the user's client writes to its config as its connections start (it turns
// the "auto" mode off on a server that refuses the handshake), and a new
// client copies the config it is given, so sharing it read it while it was
// written (the race detector caught it when a Subscribe's first pipeline
// opened connections while the next Subscribe made its reader); and a
// second client registering its handlers on the user's processor fails,
// loudly. A reader holds one connection in blocking reads and needs no
// maintenance notifications: they are off for it, and it gets a processor
// of its own.
func OneConnection(opt *redis.Options) *redis.Options {
	o := *opt
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 1, 0
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.PushNotificationProcessor = nil
	return &o
}
