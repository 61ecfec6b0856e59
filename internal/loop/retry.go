package loop

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

const (
	// backoffMin and backoffMax bound the wait after a failed call to the
	// server; it doubles with each consecutive failure.
	backoffMin = 100 * time.Millisecond
	backoffMax = 5 * time.Second
)

// ErrSharedRead wraps the error of a shared read (see Waiter) that failed.
// The reader logs its failures, once per streak at Error; the loops it read
// for handle one like a failed read of their own (they back off and drain)
// but log it at Debug, so that a failing reader is one Error line, not one
// per subscription and retry.
var ErrSharedRead = errors.New("the shared read failed")

// pauser waits for d or until ctx ends, and reports whether d passed. A
// group loop keeps sending due Acks and renewing its hold meanwhile.
type pauser func(ctx context.Context, d time.Duration) bool

// retries paces one loop's retries after failed calls to the server: it
// counts the failure, logs it, and waits a backoff that grows with each
// consecutive failure (less while a failover may be under way: the
// server's clients look for the new master).
type retries struct {
	n        int  // consecutive failures
	logged   bool // a failure of the streak was logged at Error
	faults   *Counters
	logger   watermill.LoggerAdapter
	health   Health                                         // nil: not reported
	failover func(err error, d time.Duration) time.Duration // nil: the backoff as it is
}

// fail records a failed call and waits before the next try with pause. It
// returns false when ctx ended during the wait.
func (r *retries) fail(ctx context.Context, what string, err error, pause pauser) bool {
	r.faults.Faults.Add(1)
	if r.health != nil {
		r.health.Failed(err)
	}
	r.n++
	delay := Backoff(r.n)
	if r.failover != nil {
		delay = r.failover(err, delay)
	}
	fields := watermill.LogFields{"operation": what, "attempt": r.n, "retry_in": delay.String()}
	switch {
	case errors.Is(err, ErrSharedRead):
		// Its reader logged it.
		fields["error"] = err.Error()
		r.logger.Debug("Stream call failed; retrying", fields)
	case !r.logged:
		// The first failure of a streak is the one at Error; the retries
		// that follow, at Info, until "Stream calls resumed".
		r.logged = true
		r.logger.Error("Stream call failed; retrying", err, fields)
	default:
		fields["error"] = err.Error()
		r.logger.Info("Stream call failed again; retrying", fields)
	}
	return pause(ctx, delay)
}

// succeeded ends a streak of failures.
func (r *retries) succeeded() {
	if r.n == 0 {
		return
	}
	if r.health != nil {
		r.health.Recovered()
	}
	fields := watermill.LogFields{"failed_attempts": r.n}
	if r.logged {
		r.logger.Info("Stream calls resumed", fields)
	} else {
		r.logger.Debug("Stream calls resumed", fields)
	}
	r.n, r.logged = 0, false
}

// Backoff returns the wait before retry number attempt (1 for the first),
// with a little jitter so that many consumers do not retry in step.
func Backoff(attempt int) time.Duration {
	d := backoffMin
	for i := 1; i < attempt && d < backoffMax; i++ {
		d *= 2
	}
	d = min(d, backoffMax)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
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
