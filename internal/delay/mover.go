package delay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
)

// Config is what a Mover needs from the Subscriber it moves for. Every
// field but Idle is required.
type Config struct {
	// Client is the Subscriber's client. On a *redis.Client one script
	// call moves many streams; on any other, whose keys may lie in
	// different cluster slots, one call moves one stream.
	Client redis.UniversalClient
	// Every is the beat: how long Run waits before its first round of
	// moves, and after each round before the next once a round has found a
	// sorted set of one of its streams. Positive.
	Every time.Duration
	// Idle is the beat before that: until a round finds a sorted set of
	// one of its streams, a round runs every Idle. A stream
	// added, or a Notify of one of its streams, brings the next round
	// within Every. Zero, or at most Every: always Every.
	Idle time.Duration
	// Faults counts the failed moves of a stream.
	Faults *atomic.Int64
	// Backoff returns how long a stream waits, counted from the failed
	// move, before its next move after failures consecutive failures.
	Backoff func(failures int) time.Duration
}

// Mover moves the due delayed messages of every stream a Subscriber
// subscribes to: one goroutine (Run) that, every beat, runs the move script
// for every registered stream in one pipeline (go-redis splits it per node
// on a cluster client), instead of one goroutine and one round trip per
// subscription. A stream registered several times is moved once per beat.
type Mover struct {
	config Config
	wake   chan struct{} // a stream was added or notified: the next round within Every

	mu     sync.Mutex
	topics map[string]*topic // by stream key
	// hot: a round has found a sorted set of one of the streams; from then
	// on rounds run every Every, for good, so that a Subscriber whose
	// topics are delayed to keeps the documented precision.
	hot bool
}

// topic is one registered stream of a Mover.
type topic struct {
	keys     []string // sorted set, stream
	subs     int      // registrations of the stream
	logger   watermill.LoggerAdapter
	failures int       // consecutive failed moves
	retryAt  time.Time // after a failure: no move before
}

// NewMover returns a Mover with no streams; Run moves them.
func NewMover(config Config) *Mover {
	return &Mover{config: config, topics: map[string]*topic{}, wake: make(chan struct{}, 1)}
}

// Add has the Mover move the due delayed messages of the sorted set
// delayedKey into the stream key until ctx ends. logger, with the fields of
// the first registration of key, logs its moves.
func (m *Mover) Add(ctx context.Context, key, delayedKey string, logger watermill.LoggerAdapter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.topics[key]
	if t == nil {
		t = &topic{keys: []string{delayedKey, key}, logger: logger}
		m.topics[key] = t
	}
	t.subs++
	local.add(key, m)
	context.AfterFunc(ctx, func() {
		local.remove(key, m)
		m.mu.Lock()
		defer m.mu.Unlock()
		if t.subs--; t.subs == 0 {
			delete(m.topics, key)
		}
	})
	m.signal() // its due messages move within a beat, not an idle one
}

// signal brings the next round within Every.
func (m *Mover) signal() {
	select {
	case m.wake <- struct{}{}:
	default: // a signal is pending already
	}
}

// Run moves the due messages of every registered stream every beat until
// ctx ends. A stream whose move failed is logged (once per streak of
// failures) and counted, and its next move waits a backoff; a stream whose
// move filled a batch is moved again at once.
//
// Until a round finds a sorted set of one of its streams, a round runs
// every Idle instead of every Every, and costs one EXISTS per call (see
// runMoves); a stream added or notified brings the next round within Every.
func (m *Mover) Run(ctx context.Context) {
	every := m.config.Every
	timer := time.NewTimer(every)
	defer timer.Stop()
	next := time.Now().Add(every) // when the timer fires
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
			if soon := time.Now().Add(every); soon.Before(next) {
				timer.Reset(every)
				next = soon
			}
			continue
		case <-timer.C:
		}
		select {
		case <-m.wake: // this round covers what the signal was about
		default:
		}
		found := false
		for again := m.due(time.Now()); len(again) > 0; {
			var f bool
			again, f = m.moveOnce(ctx, again)
			found = found || f
			if ctx.Err() != nil {
				return
			}
		}
		wait := m.beat(time.Now(), found)
		timer.Reset(wait)
		next = time.Now().Add(wait)
	}
}

// beat records a round at now that found a sorted set or not, and returns
// how long to wait before the next one.
func (m *Mover) beat(now time.Time, found bool) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hot = m.hot || found
	return beat(m.config.Every, m.config.Idle, m.hot)
}

// beat returns the wait before the next round: every once the Mover is
// hot, else idle, unless idle is not longer.
func beat(every, idle time.Duration, hot bool) time.Duration {
	if idle <= every || hot {
		return every
	}
	return idle
}

// due returns the streams to move at now: all but those backing off.
func (m *Mover) due(now time.Time) []*topic {
	m.mu.Lock()
	defer m.mu.Unlock()
	var due []*topic
	for _, t := range m.topics {
		if !now.Before(t.retryAt) {
			due = append(due, t)
		}
	}
	return due
}

// moveOnce moves the due messages of topics in one pipeline, and returns
// those that filled a batch (more may be due), and whether any of them had
// a sorted set (or could not be asked).
func (m *Mover) moveOnce(ctx context.Context, topics []*topic) (again []*topic, found bool) {
	var results []result
	// The wait ends with ctx whatever the client's options (see
	// internal/bounded), so that Close is never held up by a move the
	// network holds up; the moves are atomic, each runs whole or not.
	if bounded.Call(ctx, func() { results = runMoves(ctx, m.config.Client, topics) }) != nil || ctx.Err() != nil {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	every := m.config.Every
	now := time.Now()
	for i, t := range topics {
		moved, err := results[i].moved, results[i].err
		found = found || results[i].found
		if err != nil {
			t.failures++
			m.config.Faults.Add(1)
			if t.failures == 1 {
				t.logger.Error("Could not move due delayed messages into the stream; retrying with backoff. "+
					"A NOPERM reply needs the key and the commands of delayed messages for this client (see the permissions in docs/design.md), "+
					"or SubscriberConfig.DelayedPollInterval set negative where no delayed messages are published", err,
					watermill.LogFields{"delayed_key": t.keys[0]})
			}
			t.retryAt = now.Add(max(every, m.config.Backoff(t.failures)) - every)
			continue
		}
		if t.failures > 0 {
			t.logger.Info("Moving due delayed messages works again", watermill.LogFields{"delayed_key": t.keys[0], "failures": t.failures})
		}
		t.failures, t.retryAt = 0, time.Time{}
		if moved > 0 {
			t.logger.Trace("Moved due delayed messages into the stream", watermill.LogFields{"count": moved})
		}
		if moved == moveBatch && t.subs > 0 {
			again = append(again, t)
		}
	}
	return again, found
}
