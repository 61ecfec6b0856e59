package valkeystream_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// A consumer group behind a Watermill router. The handler reads the server's
// delivery count to stop retrying a message that keeps failing.
func Example() {
	logger := watermill.NewStdLogger(false, false)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: "billing",
		Start:         valkeystream.StartHead, // a new group replays the stream
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, logger)
	if err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
		if valkeystream.DeliveryCount(msg) > 5 {
			log.Printf("giving up on %s", msg.UUID)
			return nil // Ack: out of the pending list
		}
		return charge(msg) // an error Nacks: delivered again, count + 1
	})

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
// entry, starting from the entries added after Subscribe.
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
