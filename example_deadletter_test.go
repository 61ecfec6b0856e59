package valkeystream_test

import (
	"context"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// A message that fails on five deliveries goes to "orders.dead", with why and
// where from, and leaves the group's pending list. Each delivery first gets
// three quick in-process retries, which do not count as deliveries.
func ExampleDeadLetter() {
	logger := watermill.NewStdLogger(false, false)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:          client,
		ConsumerGroup:   "billing",
		Start:           valkeystream.StartHead,
		NackResendDelay: time.Second, // a failed delivery comes back after this
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, logger)
	if err != nil {
		log.Fatal(err)
	}
	deadLetter, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{
		Publisher:     pub,
		MaxDeliveries: 5,
		Logger:        logger,
	})
	if err != nil {
		log.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Logger: logger}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	// The first middleware added is the outermost: the dead-letter rule sees
	// the delivery's final error, after the retries and the panic recovery.
	router.AddMiddleware(deadLetter, retry.Middleware, middleware.Recoverer)
	router.AddConsumerHandler("charge", "orders", sub, charge)

	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
