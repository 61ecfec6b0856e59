package compat

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
)

// TestUniversalSuiteNewestWatermill runs the universal suite of the newest
// Watermill this module requires (go.mod), whole, with consumer groups and
// with fan-out. The library's own module requires the oldest Watermill it
// supports and runs that version's suite at full size (universalSuite in
// the root package), so both ends of the supported range run in every pass.
// Here the suite runs in its short form (ForceShort: fewer messages and
// Nacks; TestContinueAfterErrors alone takes 30 s at full size, by the
// Nack backoff): what this run adds is the newest version's expectations,
// such as its TestMessageCtx.
func TestUniversalSuiteNewestWatermill(t *testing.T) {
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
			Client:      redis.NewClient(&redis.Options{Addr: serverAddr}),
			CloseClient: true,
		}, nil)
		require.NoError(t, err)
		sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
			Client:        redis.NewClient(&redis.Options{Addr: serverAddr}),
			CloseClient:   true,
			ConsumerGroup: group,
			Start:         valkeystream.StartHead,
		}, nil)
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = sub.Close()
			_ = pub.Close()
		})
		return pub, sub
	}
	t.Run("groups", func(t *testing.T) {
		t.Parallel()
		tests.TestPubSub(t, tests.Features{
			ForceShort:                          true,
			ConsumerGroups:                      true,
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
		},
			func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "universal-suite") },
			newPubSub,
		)
	})
	t.Run("fan-out", func(t *testing.T) {
		t.Parallel()
		tests.TestPubSub(t, tests.Features{
			ForceShort:                          true,
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
			NewSubscriberReceivesOldMessages:    true,
		},
			func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "") },
			nil,
		)
	})
}
