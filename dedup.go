package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/dedupmark"
)

// Defaults of [DedupConfig] and [ExpiringKeyRepositoryConfig].
const (
	// DefaultDedupKeyPrefix begins every key of a [Deduplicator] and of an
	// [ExpiringKeyRepository].
	DefaultDedupKeyPrefix = "valkeystream:dedup:"
	// DefaultDedupWindow is how long a message handled successfully is
	// remembered: a duplicate that arrives later is handled again.
	DefaultDedupWindow = time.Hour
	// DefaultDedupRunningTTL is how long an in-progress mark lives without
	// renewal: after a crash, how long a redelivery of the message waits
	// before it may run.
	DefaultDedupRunningTTL = 10 * time.Second
	// DefaultDedupBusyWait is how long a delivery that finds the message in
	// progress elsewhere waits for that handling to end before it is Nacked.
	DefaultDedupBusyWait = time.Second
)

// dedupBusyPoll is how often a delivery that waits on another handling of
// its message looks at the mark again.
const dedupBusyPoll = 50 * time.Millisecond

// Mark values (see internal/dedupmark). An in-progress mark is dedupRunning
// plus a token unique to one handling.
const (
	dedupDone    = dedupmark.Done
	dedupRunning = dedupmark.Running
)

// DedupConfig configures a [Deduplicator]. [NewDeduplicator] takes a copy, so
// later changes by the caller have no effect.
type DedupConfig struct {
	// Client is the connection to the server that keeps the marks. Required.
	// It may be the client of the Subscriber or another one; each command
	// touches one key, so a cluster client works.
	Client redis.UniversalClient

	// KeyPrefix begins every mark's key. A mark's key is KeyPrefix, the
	// namespace, ":" and the message UUID. Default: DefaultDedupKeyPrefix.
	KeyPrefix string

	// Namespace separates the marks of independent handlers: handlings of
	// one UUID share a mark only within one namespace. Default: the stream
	// and the consumer group the message was delivered from (the
	// MetadataStream and MetadataGroup keys a Subscriber sets), so that the
	// consumers of one group share marks and two groups never skip each
	// other's messages. A message without a consumer group (fan-out, or not
	// read by a Subscriber) fails with an error asking for Namespace, since
	// every fan-out subscription is meant to handle every message: give
	// each of them its own Namespace.
	Namespace string

	// Window is how long a message handled successfully stays marked done:
	// a duplicate delivered within it is Acked without calling the handler,
	// one delivered later is handled again. The server keeps one key per
	// message for this long, so memory grows with the message rate times
	// Window (about 100 bytes per key). At least 1ms. Default:
	// DefaultDedupWindow.
	Window time.Duration

	// RunningTTL is how long the in-progress mark of a handling lives unless
	// renewed. It is renewed every RunningTTL/3 while the handler runs, so
	// it only bounds how long a redelivery waits after the process handling
	// the message died. At least 3ms. Default: DefaultDedupRunningTTL.
	RunningTTL time.Duration

	// BusyWait is how long a delivery that finds the message in progress
	// elsewhere waits for that handling to end (looking every 50 ms): if it
	// succeeds, the delivery is Acked as a duplicate; if it fails, the
	// delivery runs the handler. Past BusyWait the delivery fails with
	// ErrDuplicateInProgress and is Nacked. A negative value Nacks at once.
	// Default: DefaultDedupBusyWait.
	BusyWait time.Duration
}

func (c *DedupConfig) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultDedupKeyPrefix
	}
	if c.Window == 0 {
		c.Window = DefaultDedupWindow
	}
	if c.RunningTTL == 0 {
		c.RunningTTL = DefaultDedupRunningTTL
	}
	if c.BusyWait == 0 {
		c.BusyWait = DefaultDedupBusyWait
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps [ErrInvalidConfig] and names the field. Validate does not change
// c.
func (c DedupConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: DedupConfig.Client is required: pass a go-redis v9 client", ErrInvalidConfig)
	case c.Window < time.Millisecond:
		return fmt.Errorf("%w: DedupConfig.Window is %s: it must be at least 1ms (the server counts in milliseconds)", ErrInvalidConfig, c.Window)
	case c.RunningTTL < 3*time.Millisecond:
		return fmt.Errorf("%w: DedupConfig.RunningTTL is %s: it must be at least 3ms (it is renewed every third of it)", ErrInvalidConfig, c.RunningTTL)
	}
	return nil
}

// DedupStats are counters of a [Deduplicator] since it was created.
type DedupStats struct {
	// Handled counts deliveries that ran the handler.
	Handled int64
	// Marked counts handlings that succeeded and were marked done.
	Marked int64
	// Skipped counts duplicates of a message already marked done: they were
	// Acked without calling the handler.
	Skipped int64
	// Busy counts deliveries Nacked with ErrDuplicateInProgress because
	// another handling of the message did not end within BusyWait.
	Busy int64
	// Released counts handlings that failed: their in-progress mark was
	// removed so that the redelivery runs.
	Released int64
	// LostMarks counts successful handlings whose in-progress mark had
	// expired or been replaced before they ended (a handler that outlived a
	// stalled renewal): another delivery may have run meanwhile. They are
	// marked done all the same.
	LostMarks int64
	// GivenUp counts handlings that a [DeadLetter] or [DeliveryLimit]
	// inside the Deduplicator gave up on: the message was Acked as a dead
	// letter, and its mark removed (counted in Released too) rather than
	// marked done, so that a replay of the dead letter is handled.
	GivenUp int64
	// MarkFailures counts successful handlings whose done mark could not
	// be written: the message was Acked all the same, and a duplicate of it
	// would be handled again. They are counted in Faults too.
	MarkFailures int64
	// Faults counts failed calls to the server. A failure before the
	// handler fails the delivery (it is Nacked); one after it is logged and
	// leaves the handler's result as it was.
	Faults int64
}

// Deduplicator is a handler middleware that runs the handler at most once per
// message UUID within a time window, while keeping at-least-once delivery: a
// message is marked done only after its handler succeeded. See
// [Deduplicator.Middleware].
type Deduplicator struct {
	config DedupConfig
	logger watermill.LoggerAdapter
	prefix string       // dedupRunning and a random name of this Deduplicator
	next   atomic.Int64 // numbers its handlings
	stats  struct {
		handled, marked, skipped, busy, released, lostMarks, markFailures, givenUp, faults atomic.Int64
	}
}

// NewDeduplicator returns a [Deduplicator], or an error wrapping
// ErrInvalidConfig that names the bad field. logger logs failures to update
// a mark, at Error level; a nil logger logs nothing.
func NewDeduplicator(config DedupConfig, logger watermill.LoggerAdapter) (*Deduplicator, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Deduplicator{config: config, logger: logger, prefix: dedupRunning + watermill.NewShortUUID() + ":"}, nil
}

// token returns an in-progress mark unique to one handling.
func (d *Deduplicator) token() string {
	return d.prefix + strconv.FormatInt(d.next.Add(1), 10)
}

// Stats returns the Deduplicator's counters.
func (d *Deduplicator) Stats() DedupStats {
	s := &d.stats
	return DedupStats{
		Handled:      s.handled.Load(),
		Marked:       s.marked.Load(),
		Skipped:      s.skipped.Load(),
		Busy:         s.busy.Load(),
		Released:     s.released.Load(),
		LostMarks:    s.lostMarks.Load(),
		MarkFailures: s.markFailures.Load(),
		GivenUp:      s.givenUp.Load(),
		Faults:       s.faults.Load(),
	}
}

// Middleware is the handler middleware. For each message it keeps one key in
// the server (see DedupConfig.KeyPrefix and Namespace):
//
//  1. Before the handler it sets an in-progress mark with SET NX PX
//     RunningTTL, unique to this handling. If the key holds a done mark,
//     the message is a duplicate: it is Acked without calling the handler
//     and counted in Stats().Skipped. If another handling's in-progress mark
//     is there, the delivery waits up to BusyWait for it to end, then fails
//     with ErrDuplicateInProgress (Nacked, it comes back later).
//  2. While the handler runs, the mark is renewed every RunningTTL/3.
//  3. When the handler succeeds, the mark becomes done for Window, and the
//     handler's result is returned. When it fails, the mark is removed if it
//     is still this handling's, so that the redelivery runs the handler.
//     When it succeeds and produced messages, which the router publishes
//     after the middleware returns, the mark stays in progress until the
//     message is settled (its context ends): done if it was Acked, removed
//     if not, so that a failed publish of the produced messages runs the
//     handler again instead of losing them.
//
// So a handler that fails and then succeeds runs twice and is marked once,
// and two deliveries of one UUID at the same time run the handler once. What
// it cannot do: a process that dies after the handler's side effects but
// before the done mark reached the server leaves no done mark, and the
// redelivery repeats the side effects (after RunningTTL). A failed call to
// mark success is logged and counted; the message is still Acked.
//
// Add it outside (before) DeadLetter (or DeliveryLimit with Watermill's
// PoisonQueue), middleware.Retry and middleware.Recoverer, so that a busy
// delivery is not counted as a failure. A message they give up on is
// Acked and its mark removed, not marked done: a replay of its dead letter
// is handled (Watermill's own PoisonQueue without DeliveryLimit cannot say
// it gave up, and its messages are marked done):
//
//	router.AddMiddleware(dedup.Middleware, deadLetter, retry.Middleware, middleware.Recoverer)
//
// See docs/reliability.md.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		key, err := d.key(msg)
		if err != nil {
			return nil, err
		}
		token := d.token()
		switch state, err := d.begin(ctx, key, token); {
		case err != nil:
			if ctx.Err() == nil {
				d.stats.faults.Add(1)
			}
			return nil, fmt.Errorf("valkeystream: deduplicating message %s: setting its in-progress mark %q: %w", msg.UUID, key, err)
		case state == dedupDone:
			d.stats.skipped.Add(1)
			return nil, nil
		case state != "":
			d.stats.busy.Add(1)
			return nil, fmt.Errorf("%w (message %s, mark %q)", ErrDuplicateInProgress, msg.UUID, key)
		}

		d.stats.handled.Add(1)
		stop := d.renew(key, token)
		flagged, givenUp := withGivenUpFlag(ctx)
		pending := &pendingMark{key: key, window: d.config.Window}
		msg.SetContext(context.WithValue(flagged, pendingMarkKey{}, pending))
		produced, herr := h(msg)
		msg.SetContext(ctx)
		switch pending.outcome() { // an ExactlyOnce inside took the mark (step.go)
		case markCommitted:
			stop()
			d.stats.marked.Add(1)
			return produced, herr
		case markDropped:
			stop()
			d.release(ctx, msg, key, token)
			return produced, herr
		}
		if st, _ := ctx.Value(stepKey{}).(*step); st != nil && herr == nil && !givenUp.Load() {
			// An ExactlyOnce outside writes the done mark in its step.
			pending.settle = func(o markOutcome) { d.settleStepMark(ctx, msg, key, token, o, stop) }
			if err := st.addMark(pending); err != nil {
				stop()
				d.release(ctx, msg, key, token)
				return nil, err
			}
			return produced, nil
		}
		if herr == nil && givenUp.Load() {
			// Dead-lettered, not handled: no done mark, so that a replay of
			// the dead letter is handled (givenup.go).
			stop()
			d.stats.givenUp.Add(1)
			d.release(ctx, msg, key, token)
			return produced, nil
		}
		if herr == nil && len(produced) > 0 && ctx.Done() != nil {
			// The router publishes the produced messages after this returns
			// and Nacks msg if that fails: a done mark now would make the
			// redelivery skip the handler and lose them. The mark stays in
			// progress until msg is settled, which ends its context.
			context.AfterFunc(ctx, func() {
				stop()
				select {
				case <-msg.Acked():
					d.markDone(ctx, msg, key, token)
				default:
					d.release(ctx, msg, key, token)
				}
			})
			return produced, nil
		}
		stop()
		if herr != nil {
			d.release(ctx, msg, key, token)
			return produced, herr
		}
		d.markDone(ctx, msg, key, token)
		return produced, nil
	}
}

// settleStepMark ends a handling whose done mark was given to the step of
// an ExactlyOnce around the Deduplicator, once the step's outcome is known.
func (d *Deduplicator) settleStepMark(ctx context.Context, msg *message.Message, key, token string, o markOutcome, stop func()) {
	stop()
	switch o {
	case markCommitted:
		d.stats.marked.Add(1)
	case markDropped:
		d.release(ctx, msg, key, token)
	case markPlain:
		d.markDone(ctx, msg, key, token)
	}
}

// release removes the in-progress mark token of a handling that failed, if
// it is still there, so that the redelivery runs the handler. The mark is
// written even when ctx has ended: the handler's outcome is known and must
// not be forgotten.
func (d *Deduplicator) release(ctx context.Context, msg *message.Message, key, token string) {
	released, err := dedupmark.CompareAndDelete.Run(context.WithoutCancel(ctx), d.config.Client, []string{key}, token).Int()
	switch {
	case err != nil:
		d.stats.faults.Add(1)
		d.logger.Error("Could not remove the in-progress mark of a failed message; its redelivery waits for the mark to expire", err,
			watermill.LogFields{"message_uuid": msg.UUID, "key": key, "running_ttl": d.config.RunningTTL})
	case released == 1:
		d.stats.released.Add(1)
	}
}

// markDone marks the message of a handling that succeeded done, even when
// ctx has ended.
func (d *Deduplicator) markDone(ctx context.Context, msg *message.Message, key, token string) {
	ours, err := markDoneScript.Run(context.WithoutCancel(ctx), d.config.Client, []string{key}, token, d.config.Window.Milliseconds()).Int()
	if err != nil {
		d.stats.faults.Add(1)
		d.stats.markFailures.Add(1)
		d.logger.Error("Could not mark a handled message done; a duplicate of it would be handled again", err,
			watermill.LogFields{"message_uuid": msg.UUID, "key": key})
		return
	}
	d.stats.marked.Add(1)
	if ours == 0 {
		d.stats.lostMarks.Add(1)
	}
}

// key returns the key of msg's mark.
func (d *Deduplicator) key(msg *message.Message) (string, error) {
	ns := d.config.Namespace
	if ns == "" {
		group := msg.Metadata.Get(MetadataGroup)
		if group == "" {
			return "", fmt.Errorf("valkeystream: deduplicating message %s: it was not delivered through a consumer group, so its handlers cannot share marks: set DedupConfig.Namespace (one per fan-out subscription)",
				msg.UUID)
		}
		ns = dedupmark.GroupNamespace(msg.Metadata.Get(MetadataStream), group)
	}
	return dedupmark.Key(d.config.KeyPrefix, ns, msg.UUID), nil
}

// begin sets the in-progress mark token on key and returns "", or returns
// what the key holds: dedupDone, or another handling's in-progress mark
// that did not go away within BusyWait.
func (d *Deduplicator) begin(ctx context.Context, key, token string) (string, error) {
	var deadline time.Time
	if d.config.BusyWait > 0 {
		deadline = time.Now().Add(d.config.BusyWait)
	}
	var timer *time.Timer
	for {
		set, err := d.config.Client.SetNX(ctx, key, token, d.config.RunningTTL).Result()
		if err != nil || set {
			return "", err
		}
		held, err := d.config.Client.Get(ctx, key).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // it expired or was released in between: try again
		case err != nil:
			return "", err
		case held == dedupDone || !time.Now().Before(deadline):
			return held, nil
		}
		if timer == nil {
			timer = time.NewTimer(dedupBusyPoll)
			defer timer.Stop()
		} else {
			timer.Reset(dedupBusyPoll)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-timer.C:
		}
	}
}

// renew keeps the in-progress mark token on key alive, every RunningTTL/3,
// until the returned function is called. No goroutine runs until the first
// renewal is due, so a short handler costs a timer.
func (d *Deduplicator) renew(key, token string) (stop func()) {
	every := d.config.RunningTTL / 3
	ttl := d.config.RunningTTL.Milliseconds()
	var mu sync.Mutex // guards t (set after the callback may start) and stopped
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		ctx, cancel := context.WithTimeout(context.Background(), d.config.RunningTTL)
		defer cancel()
		if err := renewMarkScript.Run(ctx, d.config.Client, []string{key}, token, ttl).Err(); err != nil {
			d.stats.faults.Add(1)
			d.logger.Error("Could not renew an in-progress mark; a duplicate delivery may run if it expires", err,
				watermill.LogFields{"key": key})
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// markDoneScript marks a handled message done for ARGV[2] milliseconds and
// returns 1 if the key still held this handling's in-progress mark ARGV[1],
// 0 if that mark had expired or been replaced. It marks done in both cases:
// the handler succeeded, and a handling that took over meanwhile finds the
// done mark when it ends (and does not remove it if it fails).
//
// KEYS[1] mark.
var markDoneScript = redis.NewScript(`
local held = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'done', 'PX', ARGV[2])
if held == ARGV[1] then
  return 1
end
return 0
`)

// renewMarkScript sets the time to live of KEYS[1] to ARGV[2] milliseconds if
// it holds ARGV[1], and returns 1 if it did.
var renewMarkScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// ExpiringKeyRepositoryConfig configures an [ExpiringKeyRepository].
type ExpiringKeyRepositoryConfig struct {
	// Client is the connection to the server that keeps the keys. Required.
	Client redis.UniversalClient
	// KeyPrefix begins every key. Default: DefaultDedupKeyPrefix.
	KeyPrefix string
	// Window is how long a key is remembered. At least 1ms. Default:
	// DefaultDedupWindow.
	Window time.Duration
}

func (c *ExpiringKeyRepositoryConfig) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultDedupKeyPrefix
	}
	if c.Window == 0 {
		c.Window = DefaultDedupWindow
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps [ErrInvalidConfig] and names the field. Validate does not change
// c.
func (c ExpiringKeyRepositoryConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: ExpiringKeyRepositoryConfig.Client is required: pass a go-redis v9 client", ErrInvalidConfig)
	case c.Window < time.Millisecond:
		return fmt.Errorf("%w: ExpiringKeyRepositoryConfig.Window is %s: it must be at least 1ms (the server counts in milliseconds)", ErrInvalidConfig, c.Window)
	}
	return nil
}

// ExpiringKeyRepository keeps the keys of Watermill's middleware.Deduplicator
// in the server, so that the consumers of every process share them: it
// implements middleware.ExpiringKeyRepository with one SET NX PX per check.
//
// Watermill's Deduplicator records a key before the handler runs. If the
// handler then fails, or the process dies before it finishes, the message's
// redelivery is taken for a duplicate and dropped: delivery becomes at most
// once for those messages. Prefer [Deduplicator], which marks a message
// only after its handler succeeded; use this where that loss is acceptable,
// or for the publisher decorator of Watermill's middleware.Deduplicator.
type ExpiringKeyRepository struct {
	config ExpiringKeyRepositoryConfig
}

// NewExpiringKeyRepository returns an [ExpiringKeyRepository], or an error
// wrapping ErrInvalidConfig that names the bad field.
func NewExpiringKeyRepository(config ExpiringKeyRepositoryConfig) (*ExpiringKeyRepository, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &ExpiringKeyRepository{config: config}, nil
}

// IsDuplicate records key for Window and reports false, or reports true if
// key was recorded within Window already. It is safe for concurrent use, in
// one process or many: of several calls with one key, exactly one reports
// false.
func (r *ExpiringKeyRepository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	set, err := r.config.Client.SetNX(ctx, r.config.KeyPrefix+key, "1", r.config.Window).Result()
	if err != nil {
		return false, fmt.Errorf("valkeystream: checking deduplication key %q: %w", r.config.KeyPrefix+key, err)
	}
	return !set, nil
}
