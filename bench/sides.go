package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// The sides a scenario compares: the two adapters, and the references that
// bound what an adapter can reach.
const (
	sideValkeystream = "valkeystream"
	sideIncumbent    = "watermill-redisstream"
	sideGoChannel    = "gochannel"
	sideRaw          = "go-redis"
)

// group is the consumer group every consume run reads through.
const group = "bench"

// prefillBatch is the most messages one untimed pre-fill round trip
// writes, and prefillBytes the most payload bytes (large payloads go a few
// at a time).
const (
	prefillBatch = 1000
	prefillBytes = 8 << 20
)

// fillBatch is how many of the corpus' messages one pre-fill round trip
// writes.
func (c corpus) fillBatch() int { return max(1, min(prefillBatch, prefillBytes/c.size)) }

// A side is one contender of a scenario. Each run of a side makes its own
// clients in a scope.
type side struct {
	name      string
	reference bool // the same work without an adapter, to compare with
	inMemory  bool // keeps nothing on the server

	// partitions is the partition count of the side's topics (0: plain
	// topics)
	partitions int

	// publisher returns a publisher, for the publish scenarios.
	publisher func(sc *scope) (message.Publisher, error)

	// prefill writes the corpus to topic as this side's publisher would (not
	// timed) and returns the subscriber that will read it. nil for go-redis.
	prefill func(ctx context.Context, sc *scope, topic string, c corpus) (message.Subscriber, error)

	// fill and subscriber are the two halves of prefill, for the adapters:
	// fill writes the corpus, subscriber makes a subscriber on client.
	fill       func(ctx context.Context, sc *scope, topic string, c corpus) error
	subscriber func(sc *scope, client *redis.Client) (message.Subscriber, error)

	// rawPrefill and rawConsume are go-redis' own consume path: entries
	// written and read without any adapter.
	rawPrefill func(ctx context.Context, sc *scope, topic string, c corpus) error
	rawConsume func(ctx context.Context, sc *scope, topic string, tr *tracker) error

	// transform makes the Subscriber, Publisher and middleware of the
	// transform scenario (after fill wrote the corpus).
	transform func(sc *scope) (transformSetup, error)
}

var sides = withPrefill(map[string]side{
	sideValkeystream: {
		name:       sideValkeystream,
		publisher:  newValkeystreamPublisher,
		fill:       fillValkeystream,
		subscriber: newValkeystreamSubscriber,
		transform:  func(sc *scope) (transformSetup, error) { return newValkeystreamTransform(sc, false, false) },
	},
	sideIncumbent: {
		name:       sideIncumbent,
		publisher:  newIncumbentPublisher,
		fill:       fillIncumbent,
		subscriber: newIncumbentSubscriber,
		transform:  newIncumbentTransform,
	},
	sideGoChannel: {
		name:      sideGoChannel,
		reference: true,
		inMemory:  true,
		prefill:   prefillGoChannel,
	},
	sideRaw: {
		name:       sideRaw,
		reference:  true,
		publisher:  func(sc *scope) (message.Publisher, error) { return rawPublisher{sc.client()}, nil },
		rawPrefill: prefillRaw,
		rawConsume: consumeRaw,
	},
	sideMetrics:          metricsSide,
	sideIdempotent:       idempotentSide,
	sideIdempotentScript: idempotentScriptSide,
	sideExactlyOnce:      exactlyOnceSide,
	sideExactlyOnceState: exactlyOnceStateSide,
	sidePartitions1:      partitions1Side,
	sidePartitions8:      partitions8Side,
})

// withPrefill sets the prefill of every adapter side from its fill and
// subscriber.
func withPrefill(sides map[string]side) map[string]side {
	for name, sd := range sides {
		if sd.fill == nil {
			continue
		}
		sd.prefill = func(ctx context.Context, sc *scope, topic string, c corpus) (message.Subscriber, error) {
			if err := sd.fill(ctx, sc, topic, c); err != nil {
				return nil, err
			}
			return sd.subscriber(sc, sc.client())
		}
		sides[name] = sd
	}
	return sides
}

// valkeystream: the documented configuration, defaults otherwise.

func newValkeystreamPublisher(sc *scope) (message.Publisher, error) {
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: sc.client()}, nil)
	if err != nil {
		return nil, fmt.Errorf("creating the valkeystream publisher: %w", err)
	}
	sc.onClose("valkeystream publisher", pub.Close)
	return pub, nil
}

func fillValkeystream(ctx context.Context, sc *scope, topic string, c corpus) error {
	pub, err := newValkeystreamPublisher(sc)
	if err != nil {
		return err
	}
	return publishCorpus(ctx, pub, topic, c)
}

func newValkeystreamSubscriber(sc *scope, client *redis.Client) (message.Subscriber, error) {
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: group,
		Start:         valkeystream.StartHead,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("creating the valkeystream subscriber: %w", err)
	}
	sc.onClose("valkeystream subscriber", sub.Close)
	return sub, nil
}

// watermill-redisstream: its defaults, with a consumer group. OldestId "0"
// is its default too (a new group starts at the head of the stream), set
// here so that the pre-filled entries are read whatever a later version's
// default. Its Publisher and Subscriber close the client they are given, so
// each gets its own.

func newIncumbentPublisher(sc *scope) (message.Publisher, error) {
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: sc.client()}, watermill.NopLogger{})
	if err != nil {
		return nil, fmt.Errorf("creating the watermill-redisstream publisher: %w", err)
	}
	sc.onClose("watermill-redisstream publisher", ignoreClosed(pub.Close))
	return pub, nil
}

func fillIncumbent(ctx context.Context, sc *scope, topic string, c corpus) error {
	// Its Publisher sends one XADD round trip per message; for the untimed
	// pre-fill the same entries (its own marshaller, the same XADD
	// arguments) are pipelined.
	client := sc.client()
	marshaller := redisstream.DefaultMarshallerUnmarshaller{}
	batch := c.fillBatch()
	for from := 0; from < c.n; from += batch {
		pipe := client.Pipeline()
		for _, msg := range c.messages(from, min(from+batch, c.n)) {
			values, err := marshaller.Marshal(topic, msg)
			if err != nil {
				return fmt.Errorf("encoding message %s for watermill-redisstream: %w", msg.UUID, err)
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values, Approx: true})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("pre-filling %s: %w", topic, err)
		}
	}
	return nil
}

func newIncumbentSubscriber(sc *scope, client *redis.Client) (message.Subscriber, error) {
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: group,
		OldestId:      "0",
	}, watermill.NopLogger{})
	if err != nil {
		return nil, fmt.Errorf("creating the watermill-redisstream subscriber: %w", err)
	}
	sc.onClose("watermill-redisstream subscriber", ignoreClosed(sub.Close))
	return sub, nil
}

// ignoreClosed drops the error of closing a client that was closed already.
func ignoreClosed(f func() error) func() error {
	return func() error {
		if err := f(); err != nil && !errors.Is(err, redis.ErrClosed) {
			return err
		}
		return nil
	}
}

// gochannel: Watermill's in-memory Pub/Sub, persistent so that a subscriber
// receives what was published before it subscribed.

func prefillGoChannel(_ context.Context, sc *scope, topic string, c corpus) (message.Subscriber, error) {
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	sc.onClose("gochannel", pubSub.Close)
	if err := publishCorpus(context.Background(), pubSub, topic, c); err != nil {
		return nil, err
	}
	return pubSub, nil
}

// publishCorpus publishes the corpus with pub, c.fillBatch() messages a
// call.
func publishCorpus(ctx context.Context, pub message.Publisher, topic string, c corpus) error {
	batch := c.fillBatch()
	for from := 0; from < c.n; from += batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := pub.Publish(topic, c.messages(from, min(from+batch, c.n))...); err != nil {
			return fmt.Errorf("pre-filling %s: %w", topic, err)
		}
	}
	return nil
}
