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
// field is required.
type Config struct {
	// Client is the Subscriber's client. On a *redis.Client one script
	// call moves many streams; on any other, whose keys may lie in
	// different cluster slots, one call moves one stream.
	Client redis.UniversalClient
	// Every is the beat: how long Run waits before its first round of
	// moves, and after each round before the next. Positive.
	Every time.Duration
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

	mu     sync.Mutex
	topics map[string]*topic // by stream key
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
	return &Mover{config: config, topics: map[string]*topic{}}
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
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if t.subs--; t.subs == 0 {
			delete(m.topics, key)
		}
	})
}

// Run moves the due messages of every registered stream every beat until
// ctx ends. A stream whose move failed is logged (once per streak of
// failures) and counted, and its next move waits a backoff; a stream whose
// move filled a batch is moved again at once.
func (m *Mover) Run(ctx context.Context) {
	timer := time.NewTimer(m.config.Every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		for again := m.due(time.Now()); len(again) > 0; {
			again = m.moveOnce(ctx, again)
			if ctx.Err() != nil {
				return
			}
		}
		timer.Reset(m.config.Every)
	}
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
// those that filled a batch (more may be due).
func (m *Mover) moveOnce(ctx context.Context, topics []*topic) (again []*topic) {
	var results []result
	// The wait ends with ctx whatever the client's options (see
	// internal/bounded), so that Close is never held up by a move the
	// network holds up; the moves are atomic, each runs whole or not.
	if bounded.Call(ctx, func() { results = runMoves(ctx, m.config.Client, topics) }) != nil || ctx.Err() != nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	every := m.config.Every
	now := time.Now()
	for i, t := range topics {
		moved, err := results[i].moved, results[i].err
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
	return again
}
