package valkeystream_test

import (
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// A handler that runs at most once per message UUID within an hour, even
// when a message is delivered twice, yet still retries a message whose
// handler failed.
func ExampleDeduplicator() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	dedup, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: client}, nil)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Outermost, so that a busy duplicate is not counted as a failure by
	// the middlewares inside it.
	router.AddMiddleware(dedup.Middleware, middleware.Recoverer)
	// ... add handlers, run the router; dedup.Stats().Skipped counts the
	// duplicates it dropped.
}

// A message delivered ten minutes after it is published.
func ExamplePublisher_delayed() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		log.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"remind":"invoice 7"}`))
	delay.Message(msg, delay.For(10*time.Minute))
	if err := pub.Publish("reminders", msg); err != nil {
		log.Fatal(err)
	}
	// Until then it waits in the sorted set {reminders}:delayed; see
	// docs/delay.md to list or cancel it.
}
