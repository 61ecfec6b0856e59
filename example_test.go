package valkeystream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// A consumer group behind a Watermill router. A message whose handler still
// fails on its fifth delivery goes to "orders.dead", with why it failed and
// where it came from, and leaves the group's pending list. Each delivery
// first gets three quick in-process retries, which do not count as
// deliveries. It needs a server, so it only compiles; the examples below run.
func Example() {
	logger := watermill.NewStdLogger(false, false)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:          client,
		ConsumerGroup:   "billing",
		Start:           valkeystream.StartHead, // a new group replays the stream
		NackResendDelay: time.Second,            // a failed delivery comes back after this
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
	}, logger)
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
	router.AddNoPublisherHandler("charge", "orders", sub, charge)

	go func() {
		<-router.Running()
		_ = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{"id":1}`)))
	}()
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func charge(*message.Message) error { return nil }

// Reading a stream without a consumer group: every subscriber sees every
// entry, starting from the entries added after Subscribe. It needs a server,
// so it only compiles.
func ExampleSubscriber_fanOut() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client,
		Start:  valkeystream.StartNew,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()

	msgs, err := sub.Subscribe(context.Background(), "audit")
	if err != nil {
		log.Fatal(err)
	}
	for msg := range msgs {
		log.Printf("%s: %s", msg.Metadata.Get(valkeystream.MetadataEntryID), msg.Payload)
		msg.Ack()
	}
}

// The start position reads from configuration text, such as JSON.
func ExampleStartPosition_UnmarshalText() {
	var cfg struct {
		Start valkeystream.StartPosition `json:"start"`
	}
	if err := json.Unmarshal([]byte(`{"start": "head"}`), &cfg); err != nil {
		log.Fatal(err)
	}
	fmt.Println(cfg.Start == valkeystream.StartHead)

	err := json.Unmarshal([]byte(`{"start": "latest"}`), &cfg)
	fmt.Println(err)
	// Output:
	// true
	// valkeystream: invalid config: start position "latest" is unknown: use "new" ($, only new entries) or "head" (0, replay the stream from its head)
}

// A message becomes the fields of one stream entry: the UUID, the payload,
// and each metadata key in key order.
func ExampleDefaultMarshaler() {
	msg := message.NewMessage("6f1d7b1e-4b8a-4c1e-9d8f-1a2b3c4d5e6f", []byte(`{"id":1}`))
	msg.Metadata.Set("tenant", "acme")
	msg.Metadata.Set("kind", "order")
	fields, err := valkeystream.DefaultMarshaler{}.Marshal("orders", msg)
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < len(fields); i += 2 {
		fmt.Printf("%s = %s\n", fields[i], fields[i+1])
	}
	// Output:
	// uuid = 6f1d7b1e-4b8a-4c1e-9d8f-1a2b3c4d5e6f
	// payload = {"id":1}
	// kind = order
	// tenant = acme
}
