package valkeystream_test

import (
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// The rolling phase of a switch from watermill-redisstream: publishers write
// its layout for the consumers that still run it, and a valkeystream
// Subscriber joins the same consumer group, reading entries of both layouts.
// See docs/migration.md.
func ExampleRedisstreamMarshaler() {
	logger := watermill.NewStdLogger(false, false)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client:    client,
		Marshaler: valkeystream.RedisstreamMarshaler{}, // until no old consumer reads the topic
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: "billing",              // the group the old consumers read through
		Start:         valkeystream.StartHead, // the old default ("0"); an existing group keeps its position
		ClaimMinIdle:  time.Minute,            // at least the old MaxIdleTime while both run
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	_, _ = pub, sub
}

// An entry as watermill-redisstream writes it decodes, with the default
// Unmarshaler, to the message it was published as.
func ExampleDefaultMarshaler_Unmarshal_redisstream() {
	old := map[string]any{
		"_watermill_message_uuid": "5f0c7a2e-1f7b-4c36-9d1e-0a6b7f3c2d11",
		"payload":                 `{"order":17}`,
		"metadata":                "\x81\xa8trace_id\xa6abc123", // MessagePack {"trace_id": "abc123"}
	}
	msg, err := valkeystream.DefaultMarshaler{}.Unmarshal(old)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg.UUID, string(msg.Payload), msg.Metadata.Get("trace_id"))
	// Output: 5f0c7a2e-1f7b-4c36-9d1e-0a6b7f3c2d11 {"order":17} abc123
}
