package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream/internal/coalesce"
	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/serverinfo"
	"github.com/echomq/valkeystream/internal/sharedread"
)

// Subscriber reads stream entries as Watermill messages. It implements
// message.Subscriber and message.SubscribeInitializer. Each call to Subscribe
// starts one subscription, owned by one goroutine, that ends when its context
// is cancelled or the Subscriber is closed.
type Subscriber struct {
	config SubscriberConfig
	logger watermill.LoggerAdapter

	life lifecycle

	stats    subscriberCounters
	observe  deliveryHook // see SetDeliveryObserver
	health   healthRegistry
	failover failover.Hints    // helps the client through a failover
	verbs    *serverinfo.Known // the server's newer verbs (verbs.go)

	conns      connections        // how subscriptions share the client's connections
	delayed    delayedMoves       // moves due delayed messages; see delay.go
	partitions *partitionedTopics // the layouts of Partitions; see partitioned.go
}

// connections is how a Subscriber's subscriptions share the user's client.
type connections struct {
	shared  *sharedread.Registry // blocking reads shared by group subscriptions
	pipes   *coalesce.Pipes      // the last round trips of subscriptions ending together
	fanOuts fanOutConns          // connections fan-out reads hold; see subscription.go
}

// lifecycle is how far a Subscriber is on its way to closed.
type lifecycle struct {
	// closing is cancelled by Close; every subscription's context derives
	// from it.
	closing context.Context
	cancel  context.CancelFunc // cancels closing
	wg      sync.WaitGroup     // one per goroutine Close waits for
	exits   exits              // subscriptions' last Acks before their names' releases

	mu     sync.Mutex // guards closed and wg.Add
	closed bool

	once sync.Once // of the client's close
	err  error
}

// NewSubscriber returns a Subscriber, or an error wrapping ErrInvalidConfig
// that names the bad field. A nil logger logs nothing.
func NewSubscriber(config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	partitions, err := newPartitionedTopics(config.Partitions, config.KeyPrefix, "Partitions") // validated: cannot fail
	if err != nil {
		return nil, err
	}
	closing, cancel := context.WithCancel(context.Background())
	s := &Subscriber{
		config:     config,
		logger:     logger,
		life:       lifecycle{closing: closing, cancel: cancel},
		partitions: partitions,
	}
	s.verbs = serverinfo.NewKnown(config.Client, config.BaselineVerbs)
	s.conns.pipes = coalesce.New(config.Client, blockingWaits(config.Client))
	s.conns.shared = sharedread.NewRegistry(config.Client, config.ConsumerGroup, config.BlockTime, logger, &s.stats.Faults, s.spawn)
	if config.ClaimInterval != NoReclaim {
		s.conns.shared.ClaimInReads(func() time.Duration {
			// Only while the verbs are known: after Forget, until a loop's
			// call has found them out again, reads claim nothing.
			if v, known := s.verbs.Cached(); known && v.ClaimInRead {
				return config.ClaimMinIdle
			}
			return 0
		})
	}
	return s, nil
}

// SubscribeInitialize runs the group door for topic: it creates the consumer
// group (and the stream) if they do not exist yet. Subscribe does the same, so
// calling it is optional. Without a consumer group it does nothing. After
// Close it returns ErrSubscriberClosed.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if topic == "" {
		return errors.New("valkeystream: subscribe initialize: topic is empty")
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.life.wg.Done() // Close waits for the door before it may close the client
	if s.config.ConsumerGroup == "" {
		return nil
	}
	return s.closedOr(s.openGroup(s.life.closing, s.config.KeyPrefix+topic))
}

// closedOr returns ErrSubscriberClosed in place of err when Close ended the
// call that failed with err, else err.
func (s *Subscriber) closedOr(err error) error {
	if err != nil && s.life.closing.Err() != nil {
		return ErrSubscriberClosed
	}
	return err
}

// begin registers work that Close must wait for (call s.life.wg.Done when it
// ends), or returns ErrSubscriberClosed.
func (s *Subscriber) begin() error {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	if s.life.closed {
		return ErrSubscriberClosed
	}
	s.life.wg.Add(1)
	return nil
}

// spawn runs f in a goroutine that Close waits for. Only work that a
// subscription starts may spawn: its own count keeps Close from being past
// Wait.
func (s *Subscriber) spawn(f func()) {
	s.life.wg.Add(1)
	go func() {
		defer s.life.wg.Done()
		f()
	}()
}

// isClosed reports whether Close was called.
func (s *Subscriber) isClosed() bool {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	return s.life.closed
}

// Subscribe starts a subscription to topic and returns its messages. With a
// consumer group it first runs the group door, and returns a
// *GroupCreateError if the server refuses it; then it leases the first free
// consumer name (see SubscriberConfig.Consumer), without waiting for the
// lease of a process that died holding a name. After Close, or
// when Close ends it while it starts, it returns ErrSubscriberClosed. The
// channel is closed when ctx is cancelled or the Subscriber is closed, or
// when the subscription lost its consumer name to another one (logged at
// Error).
//
// Messages are sent one at a time: the next one comes after the previous was
// Acked or Nacked; on a partitioned topic, one at a time per partition the
// subscription owns (docs/partitions.md). Each message's context is
// cancelled once it is settled.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("valkeystream: subscribe: topic is empty")
	}
	if err := s.begin(); err != nil {
		return nil, err
	}

	// The subscription's context ends with ctx or with Close, whichever
	// comes first; the loop watches nothing else. The watcher that cancels
	// it on Close runs in a goroutine of its own, which Close waits for too.
	runCtx, cancel := context.WithCancel(ctx)
	s.life.wg.Add(1) // covered by begin's hold until the watcher is stopped or done
	stopWatch := context.AfterFunc(s.life.closing, func() {
		defer s.life.wg.Done()
		cancel()
	})
	unwatch := func() {
		if stopWatch() {
			s.life.wg.Done() // the watcher never ran
		}
	}
	key := s.config.KeyPrefix + topic
	health := s.health.add(topic, key, s.config.ConsumerGroup)
	abort := func() {
		s.health.remove(health)
		unwatch()
		cancel()
		s.life.wg.Done()
	}

	out := make(chan *message.Message)
	logFields := watermill.LogFields{"topic": topic, "stream": key}
	var run func(context.Context)

	if s.config.ConsumerGroup == "" {
		start, err := s.fanOutStart(runCtx, key)
		if err != nil {
			abort()
			return nil, s.closedOr(err)
		}
		read := s.newFanOut(key, start, health, s.logger.With(logFields), out).Run
		s.conns.fanOuts.hold(s.config.Client, s.logger)
		run = func(ctx context.Context) {
			defer s.conns.fanOuts.release()
			read(ctx)
		}
	} else {
		logFields["consumer_group"] = s.config.ConsumerGroup
		var err error
		run, err = s.subscribeGroup(runCtx, cancel, topic, key, health, logFields, out)
		if err != nil {
			abort()
			return nil, s.closedOr(err)
		}
	}

	s.logger.Debug("Subscribed", logFields)
	health.setReady()
	if streams := health.status().Partitions; streams != nil {
		for _, stream := range streams {
			s.startDelayedMover(runCtx, stream, logFields) // see delay.go
		}
	} else {
		s.startDelayedMover(runCtx, key, logFields)
	}
	go func() {
		defer s.life.wg.Done()
		defer health.end()
		defer cancel()
		defer unwatch()
		run(s.withStepSource(runCtx)) // see exactlyonce.go
	}()
	return out, nil
}

// subscribeGroup starts a subscription of topic, whose stream key is key,
// for the consumer group, and returns its run: of a partitioned topic when
// the config declares it partitioned or the server holds its partition
// count (found in the round trip of a plain one's start, see
// openSubscription), else of a plain one.
func (s *Subscriber) subscribeGroup(ctx context.Context, cancel context.CancelFunc, topic, key string,
	health *subscriptionHealth, logFields watermill.LogFields, out chan *message.Message,
) (func(context.Context), error) {
	l := s.partitions.layout(topic)
	if l == nil {
		if err := s.config.validateClaims(); err != nil { // checked by NewSubscriber unless Partitions is set
			return nil, fmt.Errorf("%w (topic %q is not one of Partitions: its subscription claims, unless the server holds it partitioned)", err, topic)
		}
		held, found, err := s.openSubscription(ctx, topic, key, s.logger.With(logFields)) // see door.go
		if err != nil {
			return nil, err
		}
		if held != nil {
			logFields["consumer"] = held.name
			health.setConsumer(held.name)
			return s.newGroupLoop(ctx, cancel, key, held, health, s.logger.With(logFields), out).Run, nil
		}
		l = found
	}
	return s.subscribePartitioned(ctx, cancel, topic, l, health, logFields, out) // see partitionsub.go
}

// Close stops every subscription, sends the Acks not sent yet, closes the
// message channels and waits until every goroutine of the Subscriber has
// returned. It closes the client only if CloseClient is set. It may be
// called more than once and from several goroutines; each call returns after
// the Subscriber has stopped. It cannot interrupt a call in progress, so how
// long it takes depends on BlockTime and the client's timeouts: the bound is
// stated in docs/design.md ("Close"). Acks that do not reach the server mean
// redeliveries, never loss.
func (s *Subscriber) Close() error {
	s.life.mu.Lock()
	s.life.closed = true
	s.life.mu.Unlock()
	s.life.cancel()
	s.life.wg.Wait()
	s.life.once.Do(func() {
		if s.config.CloseClient {
			if err := s.config.Client.Close(); err != nil {
				s.life.err = fmt.Errorf("valkeystream: closing the subscriber's client: %w", err)
			}
		}
	})
	return s.life.err
}
