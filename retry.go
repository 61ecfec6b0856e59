package valkeystream

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

const (
	// backoffMin and backoffMax bound the wait after a failed call to the
	// server; it doubles with each consecutive failure.
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

// pauser waits for d or until ctx ends, and reports whether d passed. A
// group loop keeps sending due Acks and renewing its hold meanwhile.
type pauser func(ctx context.Context, d time.Duration) bool

// retries paces one loop's retries after failed calls to the server: it
// counts the failure, logs it, and waits a backoff that grows with each
// consecutive failure.
type retries struct {
	sub    *Subscriber
	logger watermill.LoggerAdapter
	n      int                 // consecutive failures
	health *subscriptionHealth // nil: not reported

	// reader is a client of the loop's own (its blocking reader, see
	// reader.go), whose slot map a failover makes stale just as the user's
	// client's; nil when the loop has none.
	reader         redis.UniversalClient
	readerFailover failover
}

// fail records a failed call and waits before the next try with pause. It
// returns false when ctx ended during the wait.
func (r *retries) fail(ctx context.Context, what string, err error, pause pauser) bool {
	r.sub.stats.faults.Add(1)
	r.health.failed(err)
	r.n++
	delay := backoff(r.n)
	// A failover may be under way: have the client look for the new master,
	// and do not sleep long past its arrival.
	delay = r.sub.failover.retryDelay(r.sub.config.Client, err, delay)
	if r.reader != nil {
		r.readerFailover.failed(r.reader, err)
	}
	r.logger.Error("Stream call failed; retrying", err, watermill.LogFields{
		"operation": what, "attempt": r.n, "retry_in": delay.String()})
	return pause(ctx, delay)
}

// succeeded ends a streak of failures.
func (r *retries) succeeded() {
	if r.n > 0 {
		r.health.recovered()
		r.logger.Info("Stream calls resumed", watermill.LogFields{"failed_attempts": r.n})
		r.n = 0
	}
}

// backoff returns the wait before retry number attempt (1 for the first),
// with a little jitter so that many consumers do not retry in step.
func backoff(attempt int) time.Duration {
	d := backoffMin
	for i := 1; i < attempt && d < backoffMax; i++ {
		d *= 2
	}
	d = min(d, backoffMax)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// nackDelay returns how long an entry Nacked on delivery number count waits
// before it is delivered again (see SubscriberConfig.NackResendDelay).
func nackDelay(cfg *SubscriberConfig, count int64) time.Duration {
	switch {
	case cfg.NackResendDelay > 0:
		return cfg.NackResendDelay
	case cfg.NackResendDelay < 0, count <= 1:
		// A first failure is often passing: it is retried at once, and
		// only a message that keeps failing backs off.
		return 0
	}
	d := DefaultNackBackoffMin
	for i := int64(2); i < count && d < cfg.NackBackoffMax; i++ {
		d *= 2
	}
	return min(d, cfg.NackBackoffMax)
}

// logLimit lets one log line through per period and counts the lines it
// holds back, so that a failure repeated many times is logged at a bounded
// rate.
type logLimit struct {
	every      time.Duration
	next       time.Time
	suppressed int
}

// allow reports whether a line may be logged at now, and how many were held
// back since the last one that was.
func (l *logLimit) allow(now time.Time) (ok bool, suppressed int) {
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	suppressed, l.suppressed = l.suppressed, 0
	l.next = now.Add(l.every)
	return true, suppressed
}
