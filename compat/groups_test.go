package compat

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
)

// These tests back the part of docs/migration.md for people used to
// gochannel, where every subscription sees every message: with a consumer
// group, subscriptions share the group's messages.

// tally counts the messages each handler handled.
type tally struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
}

func (c *tally) add(handler string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	c.counts[handler]++
	c.total++
}

func (c *tally) get() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.counts {
		out[k] = v
	}
	return out, c.total
}

// runRouter runs router until the tally reaches want and stays there for a
// moment, then closes it.
func runRouter(t *testing.T, router *message.Router, c *tally, want int) map[string]int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	<-router.Running()
	deadline := time.Now().Add(receiveTimeout)
	for {
		_, total := c.get()
		if total >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the poll of a wait for every message
	}
	time.Sleep(300 * time.Millisecond) // long enough for a surplus delivery to show
	require.NoError(t, router.Close())
	require.NoError(t, <-done)
	counts, total := c.get()
	require.Equal(t, want, total, "messages handled: %v", counts)
	return counts
}

func publishN(t *testing.T, topic string, n int) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"n":%d}`, i))
	}
	require.NoError(t, newPublisher(t, valkeystream.DefaultMarshaler{}).Publish(topic, msgs...))
}

// TestHandlersSharingASubscriberShareItsGroup: two handlers added with one
// Subscriber read through its one group, so the ten messages are handled
// ten times in all, not ten times each.
func TestHandlersSharingASubscriberShareItsGroup(t *testing.T) {
	topic := topicName()
	publishN(t, topic, 10)
	sub := newSubscriber(t, "shared", "worker")
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	var c tally
	for _, name := range []string{"send-email", "update-stats"} {
		router.AddConsumerHandler(name, topic, sub, func(*message.Message) error { c.add(name); return nil })
	}
	// Ten in all, however they fell (the first subscription to read may
	// take the whole batch): runRouter fails on a surplus delivery.
	counts := runRouter(t, router, &c, 10)
	t.Logf("handled per handler: %v", counts)
}

// TestOneGroupPerHandler: a Subscriber per handler, its group named after
// the handler, gives each handler every message.
func TestOneGroupPerHandler(t *testing.T) {
	topic := topicName()
	publishN(t, topic, 10)
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	var c tally
	for _, name := range []string{"send-email", "update-stats"} {
		sub := newSubscriber(t, name, "worker")
		router.AddConsumerHandler(name, topic, sub, func(*message.Message) error { c.add(name); return nil })
	}
	counts := runRouter(t, router, &c, 20)
	assert.Equal(t, map[string]int{"send-email": 10, "update-stats": 10}, counts)
}

type orderPlaced struct {
	ID int `json:"id"`
}

// TestCQRSGroupNamedAfterTheHandler: an EventProcessor whose
// SubscriberConstructor names the group after the handler gives each event
// handler every event.
func TestCQRSGroupNamedAfterTheHandler(t *testing.T) {
	topic := topicName()
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	client := newClient(t)
	marshaler := cqrs.JSONMarshaler{}
	processor, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) {
			return topic, nil
		},
		SubscriberConstructor: func(p cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
				Client:        client,
				ConsumerGroup: p.HandlerName, // one group per handler: each sees every event
				Start:         valkeystream.StartHead,
				BlockTime:     50 * time.Millisecond,
			}, nil)
		},
		Marshaler: marshaler,
	})
	require.NoError(t, err)
	var c tally
	for _, name := range []string{"send-email", "update-stats"} {
		require.NoError(t, processor.AddHandlers(cqrs.NewEventHandler(name, func(context.Context, *orderPlaced) error {
			c.add(name)
			return nil
		})))
	}

	bus, err := cqrs.NewEventBusWithConfig(newPublisher(t, valkeystream.DefaultMarshaler{}), cqrs.EventBusConfig{
		GeneratePublishTopic: func(cqrs.GenerateEventPublishTopicParams) (string, error) { return topic, nil },
		Marshaler:            marshaler,
	})
	require.NoError(t, err)
	for i := range 10 {
		require.NoError(t, bus.Publish(context.Background(), &orderPlaced{ID: i}))
	}
	counts := runRouter(t, router, &c, 20)
	assert.Equal(t, map[string]int{"send-email": 10, "update-stats": 10}, counts)
}
