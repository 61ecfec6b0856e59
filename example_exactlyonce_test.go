package valkeystream_test

import (
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// A transform whose outputs exist once per input however often it runs:
// the messages it returns and the input's Ack are one step on the server.
// The Subscriber and the Publisher share one client; on a cluster the
// topics share a hash tag, so that the step's keys lie in one slot.
func ExampleNewExactlyOnce() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	logger := watermill.NewStdLogger(false, false)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "enrich", Start: valkeystream.StartHead,
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, logger)
	if err != nil {
		log.Fatal(err)
	}
	exactlyOnce, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddHandler("enrich", "{orders}.placed", sub, "{orders}.enriched", pub,
		func(msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
		},
	).AddMiddleware(
		(&middleware.Retry{MaxRetries: 3}).Middleware,
		exactlyOnce.Middleware, // last: each attempt has a step of its own
	)
	_ = router // router.Run(ctx) runs it
}

// A ledger's handler: the balance write and the record of the applied
// event join the step of the input, with the output and the Ack, so each
// event changes its account's balance once however often the handler runs.
// The state keys carry the topics' hash tag, for a cluster.
func ExampleStepOf() {
	apply := func(msg *message.Message) ([]*message.Message, error) {
		step, err := valkeystream.StepOf(msg.Context())
		if err != nil {
			return nil, err // the handler runs outside ExactlyOnce
		}
		account, cents := msg.Metadata.Get("account"), int64(250) // decoded from the payload
		if err := step.IncrBy("{accounts}:balance:"+account, cents); err != nil {
			return nil, err
		}
		if err := step.SAdd("{accounts}:applied:"+account, msg.UUID); err != nil {
			return nil, err
		}
		changed := message.NewMessage(watermill.NewUUID(), []byte(account))
		return []*message.Message{changed}, nil
	}
	_ = apply // router.AddHandler("apply", "{accounts}.events", sub, "{accounts}.balances", pub, apply).AddMiddleware(exactlyOnce.Middleware)
}
