package valkeystream_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestPublisherStats(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte("x")) }

	if err := pub.Publish("stats", msg()); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("stats", msg(), msg(), msg()); err != nil {
		t.Fatal(err)
	}
	// A message that cannot be encoded fails the call before anything is sent.
	if err := pub.Publish("stats", msg(), message.NewMessage("", nil)); err == nil {
		t.Fatal("publishing a message without UUID succeeded")
	}
	// A call whose server refuses: the key holds a string.
	if err := client.Set(context.Background(), "a-string", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var pe *valkeystream.PublishError
	if err := pub.Publish("a-string", msg(), msg()); !errors.As(err, &pe) {
		t.Fatalf("publishing to a string key: %v, want a PublishError", err)
	}

	got := pub.Stats()
	want := valkeystream.PublisherStats{Calls: 4, FailedCalls: 2, Messages: 4, FailedMessages: 4, RoundTrips: 3, RoundTripMessages: 6}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// Concurrent calls share round trips: fewer round trips than calls, and
// every message counted once.
func TestPublisherStatsShared(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 32, 50
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := pub.Publish("shared", message.NewMessage(watermill.NewUUID(), nil)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got := pub.Stats()
	if got.Calls != goroutines*each || got.Messages != goroutines*each || got.RoundTripMessages != goroutines*each {
		t.Errorf("got %+v, want %d calls, messages and round-trip messages", got, goroutines*each)
	}
	if got.RoundTrips < 1 || got.RoundTrips > got.Calls {
		t.Errorf("%d round trips for %d calls, want between 1 and the calls", got.RoundTrips, got.Calls)
	}
}
