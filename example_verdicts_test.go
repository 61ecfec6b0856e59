package valkeystream_test

import (
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/echomq/valkeystream"
)

// A handler asks for its message to come back in 30 seconds: it returns
// what RetryAfter returns, the router Nacks the message, and the Subscriber
// defers it (the metadata key tells it how long) while the next messages
// flow on. IsFinal tells middleware.Retry not to retry it in the process.
func ExampleRetryAfter() {
	handler := func(msg *message.Message) ([]*message.Message, error) {
		return nil, valkeystream.RetryAfter(msg, 30*time.Second, errors.New("rate limited"))
	}
	msg := message.NewMessage("order-7", []byte(`{"id":7}`))
	_, err := handler(msg)
	fmt.Println(err)
	fmt.Println("comes back after", msg.Metadata.Get(valkeystream.MetadataRetryAfter))
	fmt.Println("retried in the process:", !valkeystream.IsFinal(err))
	// Output:
	// valkeystream: retry later in 30s: rate limited
	// comes back after 30s
	// retried in the process: false
}

// A handler gives up on a message it knows will never succeed. Inside the
// DeadLetter middleware that is one dead letter at once, on the first
// delivery, with the reason, whatever MaxDeliveries says; middleware.Retry,
// told so with IsFinal, does not call the handler again. (Without DeadLetter
// the Subscriber writes the same dead letter to the topic's dead-letter
// stream itself.)
func ExampleGiveUp() {
	deadLetter, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{
		Publisher:     printingPublisher{},
		MaxDeliveries: 5,
		Topic:         "orders.dead",
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	retry := middleware.Retry{
		MaxRetries:  3,
		ShouldRetry: func(p middleware.RetryParams) bool { return !valkeystream.IsFinal(p.Err) },
	}
	calls := 0
	handler := deadLetter(retry.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		calls++
		return nil, valkeystream.GiveUp(msg, errors.New("card declined"))
	}))

	// What a Subscriber sets on a delivered message.
	msg := message.NewMessage("order-7", []byte(`{"id":7}`))
	msg.Metadata.Set(valkeystream.MetadataDeliveryCount, "1")
	msg.Metadata.Set(valkeystream.MetadataStream, "orders")
	msg.Metadata.Set(valkeystream.MetadataEntryID, "1700000000000-0")
	_, err = handler(msg)
	fmt.Printf("handler called %d time(s); error %v: the router Acks\n", calls, err)
	// Output:
	// published order-7 to orders.dead: error "card declined", from entry 1700000000000-0 of orders, delivery 1
	// handler called 1 time(s); error <nil>: the router Acks
}
