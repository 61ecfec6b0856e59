package valkeystream

import (
	"time"

	"github.com/redis/go-redis/v9"

	failoverhints "github.com/echomq/valkeystream/internal/failover"
)

// failover helps the client of a Publisher or Subscriber through a failover
// (see internal/failover). The zero value is ready to use and safe for
// concurrent use.
type failover struct{ h failoverhints.Hints }

// failed is told the error of a call that failed on client, and reports
// whether a failover may be under way.
func (f *failover) failed(client redis.UniversalClient, err error) bool {
	return f.h.Failed(client, err)
}

// retryDelay returns the wait before the next try after a call failed with
// err: delay, capped while a failover may be under way.
func (f *failover) retryDelay(client redis.UniversalClient, err error, delay time.Duration) time.Duration {
	return f.h.RetryDelay(client, err, delay)
}
