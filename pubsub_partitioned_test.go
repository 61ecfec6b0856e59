package valkeystream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// partitionedPubSub is a Publisher and a Subscriber of the suite on which
// every topic is partitioned: the suite makes up its topics as it goes, so
// each topic gets a Publisher and each Subscribe a Subscriber of its own,
// declaring that topic with n partitions, on one shared client.
type partitionedPubSub struct {
	client *redis.Client
	group  string
	n      int
	key    func(topic string, msg *message.Message) string

	mu     sync.Mutex
	pubs   map[string]*valkeystream.Publisher
	subs   []*valkeystream.Subscriber
	closed bool
}

func (p *partitionedPubSub) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	pub, ok := p.pubs[topic]
	if !ok && !p.closed {
		var err error
		pub, err = valkeystream.NewPublisher(valkeystream.PublisherConfig{
			Client: p.client, Partitions: map[string]int{topic: p.n}, PartitionKey: p.key,
		}, nil)
		if err != nil {
			p.mu.Unlock()
			return err
		}
		p.pubs[topic] = pub
	}
	p.mu.Unlock()
	if pub == nil {
		return valkeystream.ErrPublisherClosed
	}
	return pub.Publish(topic, msgs...)
}

func (p *partitionedPubSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, valkeystream.ErrSubscriberClosed
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:            p.client,
		ConsumerGroup:     p.group,
		Start:             valkeystream.StartHead,
		Partitions:        map[string]int{topic: p.n},
		PartitionOwnerTTL: 2 * time.Second,
		NackBackoffMax:    5 * time.Millisecond, // see shortNackBackoff
	}, testLogger())
	if err == nil {
		p.subs = append(p.subs, sub)
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return sub.Subscribe(ctx, topic)
}

func (p *partitionedPubSub) Close() error {
	p.mu.Lock()
	p.closed = true
	pubs, subs := p.pubs, p.subs
	p.pubs, p.subs = map[string]*valkeystream.Publisher{}, nil
	p.mu.Unlock()
	var errs []error
	for _, s := range subs {
		errs = append(errs, s.Close())
	}
	for _, pub := range pubs {
		errs = append(errs, pub.Close())
	}
	return errors.Join(errs...)
}

func newPartitionedPubSub(t *testing.T, client *redis.Client, group string, n int, key func(string, *message.Message) string) (message.Publisher, message.Subscriber) {
	// Two values: the suite closes a publisher it does not need while the
	// subscriber runs.
	pub := &partitionedPubSub{client: client, group: group, n: n, key: key, pubs: map[string]*valkeystream.Publisher{}}
	sub := &partitionedPubSub{client: client, group: group, n: n, key: key, pubs: map[string]*valkeystream.Publisher{}}
	t.Cleanup(func() {
		_ = sub.Close()
		_ = pub.Close()
	})
	return pub, sub
}

// TestPubSubPartitioned runs Watermill's universal suite on partitioned
// topics (4 partitions) with consumer groups. Without a partition key the
// messages go to the partitions in turn, so the order is not kept across
// them (GuaranteedOrder false); TestPubSubPartitionedOneKey gives every
// message one key, which keeps it.
func TestPubSubPartitioned(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 500})
	t.Cleanup(func() { _ = client.Close() })
	features := tests.Features{
		ConsumerGroups: true,
		Persistent:     true,
		ForceShort:     shortTopologySuites,
	}
	universalSuite(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPartitionedPubSub(t, client, "universal-suite", 4, nil)
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return newPartitionedPubSub(t, client, group, 4, nil)
		},
	)
}

// TestPubSubPartitionedOneKey runs the suite with every message under one
// partition key: one partition, in order.
func TestPubSubPartitionedOneKey(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 500})
	t.Cleanup(func() { _ = client.Close() })
	oneKey := func(string, *message.Message) string { return "the-key" }
	features := tests.Features{
		ConsumerGroups:                      true,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
	}
	universalSuite(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPartitionedPubSub(t, client, "universal-suite", 4, oneKey)
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return newPartitionedPubSub(t, client, group, 4, oneKey)
		},
	)
}
