//go:build stress

package valkeystream_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/echomq/valkeystream/internal/testserver"
)

func init() { assertTimings, shortTopologySuites = true, false }

// TestPubSubStress runs the universal suite (universalSuite) many times in
// parallel (STRESS_TEST_COUNT, default 10), as Watermill's
// TestPubSubStressTest does: go test -tags stress -run TestPubSubStress.
func TestPubSubStress(t *testing.T) {
	srv := testserver.Start(t)
	count := 10
	if s := os.Getenv("STRESS_TEST_COUNT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("STRESS_TEST_COUNT=%q: want a positive integer", s)
		}
		count = n
	}
	for i := range count {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			universalSuite(t,
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
		})
	}
}
