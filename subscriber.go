package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// Subscriber reads stream entries as Watermill messages. It implements
// message.Subscriber and message.SubscribeInitializer. Each call to Subscribe
// starts one subscription, owned by one goroutine, that ends when its context
// is cancelled or the Subscriber is closed.
type Subscriber struct {
	config SubscriberConfig
	logger watermill.LoggerAdapter

	// closing is cancelled by Close; every subscription's context derives
	// from it.
	closing context.Context
	cancel  context.CancelFunc

	mu     sync.Mutex // guards closed and wg.Add
	closed bool
	wg     sync.WaitGroup // one per running subscription

	closeOnce sync.Once
	closeErr  error

	stats counters

	failover failover // helps the client through a failover; see failover.go
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
	closing, cancel := context.WithCancel(context.Background())
	return &Subscriber{
		config:  config,
		logger:  logger,
		closing: closing,
		cancel:  cancel,
	}, nil
}

// SubscribeInitialize runs the group door for topic: it creates the consumer
// group (and the stream) if they do not exist yet. Subscribe does the same, so
// calling it is optional. Without a consumer group it does nothing.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if topic == "" {
		return errors.New("valkeystream: subscribe initialize: topic is empty")
	}
	if s.config.ConsumerGroup == "" {
		return nil
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.wg.Done() // Close waits for the door before it may close the client
	return s.openGroup(s.closing, s.config.KeyPrefix+topic)
}

// begin registers work that Close must wait for (call s.wg.Done when it
// ends), or returns ErrSubscriberClosed.
func (s *Subscriber) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSubscriberClosed
	}
	s.wg.Add(1)
	return nil
}

// Subscribe starts a subscription to topic and returns its messages. With a
// consumer group it first runs the group door, and returns a
// *GroupCreateError if the server refuses it. The channel is closed when ctx
// is cancelled or the Subscriber is closed.
//
// Messages are sent one at a time: the next one comes after the previous was
// Acked or Nacked. Each message's context is cancelled once it is settled.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("valkeystream: subscribe: topic is empty")
	}
	if err := s.begin(); err != nil {
		return nil, err
	}

	// The subscription's context ends with ctx or with Close, whichever
	// comes first; the loop watches nothing else.
	runCtx, cancel := context.WithCancel(ctx)
	stopWatch := context.AfterFunc(s.closing, cancel)
	abort := func() {
		stopWatch()
		cancel()
		s.wg.Done()
	}

	key := s.config.KeyPrefix + topic
	out := make(chan *message.Message)
	logFields := watermill.LogFields{"topic": topic, "stream": key}
	var l interface{ run(context.Context) }
	release := func() {}

	if s.config.ConsumerGroup == "" {
		start, err := s.fanOutStart(runCtx, key)
		if err != nil {
			abort()
			return nil, err
		}
		logger := s.logger.With(logFields)
		l = &fanOutLoop{sub: s, key: key, out: out, lastID: start, logger: logger,
			retries: retries{sub: s, logger: logger}}
	} else {
		if err := s.openGroup(runCtx, key); err != nil {
			abort()
			return nil, err
		}
		if err := s.checkScripts(runCtx, key); err != nil {
			abort()
			return nil, err
		}
		var consumer string
		consumer, release = acquireConsumerName(key, s.config.ConsumerGroup, s.config.Consumer)
		logFields["consumer_group"] = s.config.ConsumerGroup
		logFields["consumer"] = consumer
		l = newGroupLoop(s, key, consumer, out, s.logger.With(logFields))
	}

	s.logger.Debug("Subscribed", logFields)
	go func() {
		defer s.wg.Done()
		defer release()
		defer cancel()
		defer stopWatch()
		l.run(runCtx)
	}()
	return out, nil
}

// Close stops every subscription, sends the Acks not sent yet, closes the
// message channels and waits until every goroutine of the Subscriber has
// returned. It closes the client only if CloseClient is set.
//
// Close cannot interrupt a call in progress: a blocking read ends within
// BlockTime, any other call within the client's own timeouts (ReadTimeout,
// WriteTimeout and its retries; go-redis honours context deadlines only with
// ContextTimeoutEnabled). The last Acks get 5 s when the client honours
// deadlines, else the client's timeouts; Acks that do not reach the server
// mean redeliveries, never loss. Close may be
// called more than once and from several goroutines; each call returns after
// the Subscriber has stopped.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.closeOnce.Do(func() {
		if s.config.CloseClient {
			if err := s.config.Client.Close(); err != nil {
				s.closeErr = fmt.Errorf("valkeystream: closing the subscriber's client: %w", err)
			}
		}
	})
	return s.closeErr
}

// openGroup is the group door: XGROUP CREATE <key> <group> <start> MKSTREAM,
// where BUSYGROUP is success and every other reply an error.
func (s *Subscriber) openGroup(ctx context.Context, key string) error {
	err := s.config.Client.XGroupCreateMkStream(ctx, key, s.config.ConsumerGroup, s.config.Start.id()).Err()
	if err == nil || redis.HasErrorPrefix(err, "BUSYGROUP") {
		return nil
	}
	return &GroupCreateError{Key: key, Group: s.config.ConsumerGroup, Err: err}
}

// checkScripts runs both server-side scripts of the loop once, with
// arguments that change nothing, so that a client that may not run scripts
// fails at Subscribe rather than at its first Nack, and so that the server
// has them cached.
func (s *Subscriber) checkScripts(ctx context.Context, key string) error {
	group, consumer := s.config.ConsumerGroup, s.config.Consumer
	err := renewScript.Run(ctx, s.config.Client, []string{key}, group, consumer).Err()
	if err == nil {
		err = claimBackScript.Run(ctx, s.config.Client, []string{key}, group, consumer, "0-1").Err()
	}
	if err == nil || errors.Is(err, redis.Nil) {
		return nil
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: the server refused to run the subscription's scripts (EVALSHA, EVAL); allow them for this client: %w",
			key, group, err)
	}
	return fmt.Errorf("valkeystream: subscribing to stream %q with group %q: checking the subscription's scripts: %w", key, group, err)
}

// fanOutStart resolves where a fan-out subscription begins. StartNew is turned
// into the id of the last entry now, so that nothing added after Subscribe
// returns is missed.
func (s *Subscriber) fanOutStart(ctx context.Context, key string) (string, error) {
	if s.config.Start == StartHead {
		return "0-0", nil
	}
	last, err := s.config.Client.XRevRangeN(ctx, key, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("valkeystream: reading the last entry of stream %q to start a fan-out subscription: %w", key, err)
	}
	if len(last) == 0 {
		return "0-0", nil
	}
	return last[0].ID, nil
}

// Stats are counters of a Subscriber since it was created, summed over its
// subscriptions.
type Stats struct {
	// Delivered counts messages sent on subscription channels, redeliveries
	// included.
	Delivered int64
	// Acked counts entries acknowledged to the server with XACK.
	Acked int64
	// Nacked counts Nacks.
	Nacked int64
	// Drained counts own pending entries delivered again after a start or a
	// fault.
	Drained int64
	// Reclaimed counts entries taken over from idle consumers by XAUTOCLAIM.
	Reclaimed int64
	// MissingBodies counts pending entries that were trimmed or deleted from
	// the stream before they were handled: they are acknowledged and logged,
	// never delivered.
	MissingBodies int64
	// InvalidEntries counts entries that could not be decoded. With a group
	// they are dead-lettered (see DeadLetterSuffix) and acknowledged; in
	// fan-out they are logged and skipped.
	InvalidEntries int64
	// Faults counts failed calls to the server: reads, claims, Acks and
	// renewals. Reads and claims back off before they retry; a failed
	// renewal is tried again on its next beat.
	Faults int64
}

type counters struct {
	delivered, acked, nacked, drained, reclaimed, missingBodies, invalidEntries, faults atomic.Int64
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	c := &s.stats
	return Stats{
		Delivered:      c.delivered.Load(),
		Acked:          c.acked.Load(),
		Nacked:         c.nacked.Load(),
		Drained:        c.drained.Load(),
		Reclaimed:      c.reclaimed.Load(),
		MissingBodies:  c.missingBodies.Load(),
		InvalidEntries: c.invalidEntries.Load(),
		Faults:         c.faults.Load(),
	}
}

// consumerNames holds the consumer names in use by running subscriptions of
// this process, so that two subscriptions never share one pending list.
var consumerNames = struct {
	sync.Mutex
	inUse map[[3]string]struct{}
}{inUse: map[[3]string]struct{}{}}

// acquireConsumerName returns base, or base-2, base-3, ... for the first name
// no running subscription of this process uses on key and group. The same
// order of subscriptions after a restart yields the same names.
func acquireConsumerName(key, group, base string) (name string, release func()) {
	consumerNames.Lock()
	defer consumerNames.Unlock()
	for i := 1; ; i++ {
		name = base
		if i > 1 {
			name = base + "-" + strconv.Itoa(i)
		}
		k := [3]string{key, group, name}
		if _, taken := consumerNames.inUse[k]; !taken {
			consumerNames.inUse[k] = struct{}{}
			return name, func() {
				consumerNames.Lock()
				delete(consumerNames.inUse, k)
				consumerNames.Unlock()
			}
		}
	}
}
