package valkeystream_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
)

// printingPublisher prints what it is asked to publish.
type printingPublisher struct{}

func (printingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		fmt.Printf("published %s to %s: error %q, from entry %s of %s, delivery %s\n", m.UUID, topic,
			m.Metadata.Get(valkeystream.MetadataError),
			m.Metadata.Get(valkeystream.MetadataOriginalEntryID),
			m.Metadata.Get(valkeystream.MetadataOriginalStream),
			m.Metadata.Get(valkeystream.MetadataOriginalDeliveryCount))
	}
	return nil
}

func (printingPublisher) Close() error { return nil }

// A handler that fails on a message's third delivery gives it up: the
// middleware publishes a dead letter that says why it failed and where it
// came from, and reports success, so that the router Acks the original.
// Earlier failures pass through and Nack it. (Topic is set because this
// handler runs outside a router; in a router it defaults to the topic plus
// Suffix.)
func ExampleDeadLetter() {
	deadLetter, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{
		Publisher:     printingPublisher{},
		MaxDeliveries: 3,
		Topic:         "orders.dead",
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	handler := deadLetter(func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New("card declined")
	})

	for count := 2; count <= 3; count++ {
		// What a Subscriber sets on a delivered message.
		msg := message.NewMessage("order-7", []byte(`{"id":7}`))
		msg.Metadata.Set(valkeystream.MetadataDeliveryCount, fmt.Sprint(count))
		msg.Metadata.Set(valkeystream.MetadataStream, "orders")
		msg.Metadata.Set(valkeystream.MetadataEntryID, "1700000000000-0")
		_, err := handler(msg)
		fmt.Printf("delivery %d: handler error %v\n", count, err)
	}
	// Output:
	// delivery 2: handler error card declined
	// published order-7 to orders.dead: error "card declined", from entry 1700000000000-0 of orders, delivery 3
	// delivery 3: handler error <nil>
}
