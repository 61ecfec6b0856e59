package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestKeyBeginsWithTheStreamKeyAndKeepsGroupsApart(t *testing.T) {
	assert.Equal(t, "{orders}.eu:lease:billing:host-1", Key("{orders}.eu", "billing", "host-1"))
	assert.NotEqual(t, Key("s", "a:b", "c"), Key("s", "a", "b:c"), "a ':' in a group must not make two leases one")
	assert.Equal(t, "s:lease:a%3Ab%25:c", Key("s", "a:b%", "c"))
	assert.Equal(t, "host", indexedName("host", 1))
	assert.Equal(t, "host-3", indexedName("host", 3))
}

// leaseEnv is a private server and what a lease of stream "s", group "g"
// and base name "worker" is handed; Close of the test waits for the
// goroutines that Spawn started.
type leaseEnv struct {
	client *redis.Client
	cfg    Config
	deps   Deps
	faults *atomic.Int64
}

func newLeaseEnv(t *testing.T, ttl time.Duration) *leaseEnv {
	t.Helper()
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		wg.Wait()
		_ = client.Close()
	})
	faults := new(atomic.Int64)
	return &leaseEnv{
		client: client,
		cfg:    Config{Stream: "s", Group: "g", Consumer: "worker", TTL: ttl},
		deps: Deps{
			Client: client,
			Faults: faults,
			Spawn: func(f func()) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f()
				}()
			},
			Logger:    watermill.NopLogger{},
			TakeError: func(name string, err error) error { return err },
		},
		faults: faults,
	}
}

// first sends the first try of the base name on a pipeline of its own.
func (e *leaseEnv) first(t *testing.T) *First {
	t.Helper()
	ctx := context.Background()
	pipe := e.client.Pipeline()
	f := QueueFirst(ctx, pipe, e.cfg, e.deps)
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	return f
}
