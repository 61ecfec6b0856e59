package valkeystream

import (
	"context"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// blockingReader is the client a group subscription sends its blocking reads
// (XREADGROUP ... BLOCK) through: a client of its own, made from the options
// of the user's client, so that closing it ends a blocked read at once when
// the subscription ends, instead of after BlockTime. It holds one connection
// (a cluster client, one per node it reads from). Commands sent through it
// skip the hooks added to the user's client (AddHook): tracing or metrics
// hooks do not see the blocking reads. Every other command, the non-blocking
// read that goes with the Acks included, uses the user's client. For a
// client of another type (a ring, a wrapper) it is that client itself, and a
// blocked read ends within BlockTime as before.
type blockingReader struct {
	client redis.UniversalClient
	own    bool // client is this reader's, to close
}

func newBlockingReader(c redis.UniversalClient) blockingReader {
	switch c := c.(type) {
	case *redis.Client:
		return blockingReader{client: redis.NewClient(oneConnection(c.Options())), own: true}
	case *redis.ClusterClient:
		opt := *c.Options()
		opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 1, 0, 1, 0
		return blockingReader{client: redis.NewClusterClient(&opt), own: true}
	default:
		return blockingReader{client: c}
	}
}

// interruptOn closes the reader once ctx ends, which ends a read in progress.
// The returned function closes it (if it has not been) and returns once the
// close made for ctx, if any, has finished.
func (r blockingReader) interruptOn(ctx context.Context) (closeNow func()) {
	if !r.own {
		return func() {}
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = r.client.Close()
	})
	return func() {
		if stop() {
			_ = r.client.Close()
			return
		}
		<-done
	}
}

// oneConnection returns a copy of opt for a client of one connection: a
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
func oneConnection(opt *redis.Options) *redis.Options {
	o := *opt
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 1, 0
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.PushNotificationProcessor = nil
	return &o
}
