//go:build stress

package valkeystream_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/echomq/valkeystream/internal/testserver"
)

func init() { assertTimings = true }

// TestPubSubStress runs the universal suite many times in parallel
// (STRESS_TEST_COUNT, default 10): go test -tags stress -run TestPubSubStress.
func TestPubSubStress(t *testing.T) {
	srv := testserver.Start(t)
	tests.TestPubSubStressTest(t,
		tests.Features{
			ConsumerGroups:                      true,
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
		},
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			return newPubSub(t, srv, "universal-suite")
		},
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
			return newPubSub(t, srv, group)
		},
	)
}
