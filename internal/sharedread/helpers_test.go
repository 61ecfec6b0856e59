package sharedread

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// testRegistry is a Registry of group "g" whose goroutines, and those a
// test starts with its spawn, are counted: goroutines.Wait returns once all
// have ended.
type testRegistry struct {
	*Registry
	faults     atomic.Int64
	goroutines sync.WaitGroup
}

func newTestRegistry(client redis.UniversalClient, block time.Duration, logger watermill.LoggerAdapter) *testRegistry {
	r := &testRegistry{}
	r.Registry = NewRegistry(client, "g", block, logger, &r.faults, r.spawn)
	return r
}

func (r *testRegistry) spawn(f func()) {
	r.goroutines.Add(1)
	go func() {
		defer r.goroutines.Done()
		f()
	}()
}
