// Package failover helps go-redis clients through a failover: it notices,
// in the errors of failed calls, that a master may have gone away, and has a
// cluster client reload its slot map at once instead of after a minute.
package failover

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// reloadInterval is the shortest time between two slot-map
	// reloads that failed calls ask of a cluster client.
	reloadInterval = 250 * time.Millisecond

	// RetryMax caps the wait before a loop's next try while a
	// failover may be under way (a connection error on a cluster or Sentinel
	// client): the new master may take over any moment, and a loop that
	// sleeps its full backoff (up to its backoff cap) would stall long after.
	RetryMax = 500 * time.Millisecond
)

// Hints notices, in the errors of failed calls, that a master may have
// gone away, and helps the client find the new one. go-redis' ClusterClient
// reloads its slot map on its own only after a MOVED or READONLY reply or
// every ClusterStateReloadInterval (a minute by default): after a master
// crash its calls keep going to the dead address and fail with connection
// errors until then. failed asks it to reload as soon as such errors
// appear, and again while they last, so that a crash costs the cluster's
// own promotion time. A Sentinel failover client switches by itself when
// the sentinels announce the new master. The zero value is ready to use and
// safe for concurrent use.
type Hints struct {
	lastReload atomic.Int64 // unix nanoseconds of the last reload asked for
}

// Failed is told the error of a call that failed on client. When the error
// is one a failover causes and client can fail over (a cluster or Sentinel
// client), it makes a cluster client reload its slot map, at most once per
// reloadInterval, and reports true.
func (f *Hints) Failed(client redis.UniversalClient, err error) bool {
	if !Symptom(err) {
		return false
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		now := time.Now().UnixNano()
		last := f.lastReload.Load()
		if now-last >= int64(reloadInterval) && f.lastReload.CompareAndSwap(last, now) {
			// Asynchronous: it loads CLUSTER SLOTS from a node in a
			// goroutine of the client's own, and coalesces with a reload
			// already running.
			c.ReloadState(context.Background())
		}
		return true
	case *redis.Client:
		return IsSentinel(c)
	}
	return false
}

// RetryDelay returns the wait before a loop's next try after a call failed
// with err: delay, or at most RetryMax when f.Failed says a failover
// may be under way.
func (f *Hints) RetryDelay(client redis.UniversalClient, err error, delay time.Duration) time.Duration {
	if f.Failed(client, err) {
		return min(delay, RetryMax)
	}
	return delay
}

// Symptom reports whether err is one a failover causes: the
// connection to the old master failed (refused, reset, closed, timed out),
// or a node answered that the cluster or the master is not available right
// now. Other replies (WRONGTYPE, NOGROUP, ...) and a cancelled context are
// not.
func Symptom(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	// A dial that timed out may wrap context.DeadlineExceeded; any other
	// context error is the caller's own.
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	// MOVED and ASK reach here only from a pipeline sent to one node
	// (WaitReplicas on a cluster): the slot map is stale.
	for _, prefix := range []string{"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "LOADING", "MOVED", "ASK"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// sentinelClientAddr is the address go-redis gives the client that
// redis.NewFailoverClient returns (it asks the sentinels for the real one).
const sentinelClientAddr = "FailoverClient"

// IsSentinel reports whether c is a Sentinel failover client
// (redis.NewFailoverClient), which follows a failover by closing its own
// connections to the old master.
func IsSentinel(c *redis.Client) bool { return c.Options().Addr == sentinelClientAddr }
