package valkeystream_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// newPubSub returns a Publisher and a Subscriber, each with a client of its
// own that its Close closes. An empty group makes a fan-out Subscriber. Every
// timing is the shipped default.
func newPubSub(t *testing.T, srv *testserver.Server, group string) (message.Publisher, message.Subscriber) {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client:      redis.NewClient(&redis.Options{Addr: srv.Addr()}),
		CloseClient: true,
	}, testLogger())
	require.NoError(t, err)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        redis.NewClient(&redis.Options{Addr: srv.Addr()}),
		CloseClient:   true,
		ConsumerGroup: group,
		Start:         valkeystream.StartHead,
	}, testLogger())
	require.NoError(t, err)
	return pub, sub
}

// TestPubSub runs Watermill's universal suite with consumer groups: one group
// per topic for the plain constructor, the group the suite names for the
// consumer-group tests. A new subscriber of a group does not receive what the
// group already handled, so NewSubscriberReceivesOldMessages is false here;
// TestPubSubFanOut covers it.
func TestPubSub(t *testing.T) {
	srv := testserver.Start(t)
	features := tests.Features{
		ConsumerGroups:                      true,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		RestartServiceCommand:               srv.RestartCommand(),
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPubSub(t, srv, "universal-suite")
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return newPubSub(t, srv, group)
		},
	)
}

// TestPubSubFanOut runs Watermill's universal suite without consumer groups:
// every subscriber reads the whole stream from its head.
func TestPubSubFanOut(t *testing.T) {
	srv := testserver.Start(t)
	features := tests.Features{
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		NewSubscriberReceivesOldMessages:    true,
		RestartServiceCommand:               srv.RestartCommand(),
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPubSub(t, srv, "")
		},
		nil,
	)
}
