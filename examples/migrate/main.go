// Command migrate switches a live consumer group from watermill-redisstream
// to valkeystream on a private server, as docs/migration.md describes, and
// checks that no message is lost on the way:
//
//  1. it finds a server (see server.go);
//  2. watermill-redisstream publishes orders, and one of its consumers (with
//     its default random name) handles some, takes one more and dies before
//     acknowledging it, leaving entries pending in the group;
//  3. the publishers move to valkeystream first, still writing the old
//     layout (RedisstreamMarshaler), so that old consumers could go on;
//  4. a valkeystream Subscriber joins the same group in a Watermill Router:
//     it reads the old entries with their UUIDs and metadata, reclaims the
//     dead consumer's pending entries once idle, and reads the rest;
//  5. the publishers switch to the default layout;
//  6. it checks every order was handled, none dead-lettered, nothing left
//     pending, and removes the old consumer names, which hold nothing now.
//
// Run it from the repository root:
//
//	go run -C examples ./migrate
//
// Environment:
//
//	VALKEYSTREAM_ADDR=host:port  use that server instead of starting one
//	VALKEYSTREAM_DEMO_LOG=1      print Watermill's and valkeystream's logs
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

const (
	// group is the consumer group both libraries read through: keeping its
	// name is what carries its position and pending entries over.
	group = "billing"
	// claimMinIdle is how long the dead consumer's entries must be idle
	// before valkeystream reclaims them. Shortened so the example runs in
	// seconds; keep the default (30s) or more in production, at least as
	// long as the slowest handler.
	claimMinIdle = 2 * time.Second
	// timeout bounds the whole run.
	timeout = 60 * time.Second
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "migrate failed:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if os.Getenv("VALKEYSTREAM_DEMO_LOG") != "" {
		logger = watermill.NewStdLogger(false, false)
	}

	fmt.Println("== 1. Server")
	addr, stopServer, err := startServer(ctx)
	if err != nil {
		return err
	}
	defer stopServer()
	// watermill-redisstream closes the client it is given on Close, so each
	// of its Publishers and Subscribers gets one of its own.
	newClient := func() *redis.Client { return redis.NewClient(&redis.Options{Addr: addr}) }
	client := newClient()
	defer client.Close()
	topic := "orders-" + watermill.NewShortUUID()

	var (
		published []*message.Message
		handled   = map[string]string{} // UUID -> who handled it
	)
	order := func() *message.Message {
		n := len(published) + 1
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order-%02d", n))
		if n%2 == 0 {
			msg.Metadata.Set("trace_id", fmt.Sprintf("trace-%02d", n))
		}
		published = append(published, msg)
		return msg
	}

	// ---- 2. The incumbent at work -------------------------------------
	fmt.Printf("== 2. watermill-redisstream publishes 20 orders; one of its consumers handles 8 and dies holding more\n")
	oldPub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: newClient()}, logger)
	if err != nil {
		return err
	}
	for range 20 {
		if err := oldPub.Publish(topic, order()); err != nil {
			return fmt.Errorf("publishing with watermill-redisstream: %w", err)
		}
	}
	_ = oldPub.Close()
	oldSub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        newClient(),
		ConsumerGroup:                 group, // Consumer left empty: a random name, as most deployments have
		OldestId:                      "0",
		DisableIndefiniteInitialBlock: true,
	}, logger)
	if err != nil {
		return err
	}
	oldMsgs, err := oldSub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	for range 8 {
		msg, err := next(ctx, oldMsgs)
		if err != nil {
			return err
		}
		handled[msg.UUID] = "watermill-redisstream"
		msg.Ack()
	}
	if _, err := next(ctx, oldMsgs); err != nil { // taken, never acknowledged
		return err
	}
	_ = oldSub.Close()
	summary, err := client.XPending(ctx, topic, group).Result()
	if err != nil {
		return err
	}
	for name, n := range summary.Consumers {
		fmt.Printf("   XPENDING %s %s: %d entries pending for consumer %q, which will never come back\n", topic, group, n, name)
	}
	if summary.Count == 0 {
		return errors.New("the dead consumer left nothing pending; the example expected it to")
	}

	// ---- 3. Publishers move first, still writing the old layout ----------
	fmt.Println("== 3. The publishers move to valkeystream, writing the old layout (RedisstreamMarshaler) for old readers")
	rollingPub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client:    client,
		Marshaler: valkeystream.RedisstreamMarshaler{},
	}, logger)
	if err != nil {
		return err
	}
	batch := make([]*message.Message, 10)
	for i := range batch {
		batch[i] = order()
	}
	if err := rollingPub.Publish(topic, batch...); err != nil {
		return err
	}
	fmt.Println("   10 orders published in one call")

	// ---- 4. valkeystream takes over the group -----------------------------
	fmt.Printf("== 4. A valkeystream Subscriber joins group %q in a Router (ClaimMinIdle %s)\n", group, claimMinIdle)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: group, // the same group: its position and pending entries carry over
		Consumer:      "billing-1",
		Start:         valkeystream.StartHead, // only used if the group did not exist
		ClaimMinIdle:  claimMinIdle,
		ClaimInterval: 500 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	seen := make(chan *message.Message)
	router.AddConsumerHandler("billing", topic, sub, func(msg *message.Message) error {
		select {
		case seen <- msg:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	defer router.Close()

	// await takes the handler's messages until every published order is
	// handled; only this goroutine touches handled.
	await := func(what string) error {
		for {
			missing := len(published) - len(handled)
			if missing == 0 {
				return nil
			}
			select {
			case msg := <-seen:
				if by, dup := handled[msg.UUID]; dup {
					return fmt.Errorf("%s (%s) was handled by %s and again by valkeystream", msg.UUID, msg.Payload, by)
				}
				handled[msg.UUID] = "valkeystream"
				how := "read"
				if valkeystream.DeliveryCount(msg) > 1 {
					how = fmt.Sprintf("reclaimed (delivery %d)", valkeystream.DeliveryCount(msg))
				}
				fmt.Printf("   %s %-22s uuid %s trace_id %-10q %s\n", msg.Payload, how, msg.UUID[:8], msg.Metadata.Get("trace_id"), what)
			case err := <-routerDone:
				return fmt.Errorf("the router stopped early: %v", err)
			case <-ctx.Done():
				return fmt.Errorf("waiting for %d orders: %w", missing, ctx.Err())
			}
		}
	}
	if err := await("(old layout)"); err != nil {
		return err
	}

	// ---- 5. No old reader left: back to the default layout -------------
	fmt.Println("== 5. No watermill-redisstream reader is left: the publishers switch to DefaultMarshaler")
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, logger)
	if err != nil {
		return err
	}
	batch = make([]*message.Message, 5)
	for i := range batch {
		batch[i] = order()
	}
	if err := pub.Publish(topic, batch...); err != nil {
		return err
	}
	if err := await("(default layout)"); err != nil {
		return err
	}

	// ---- 6. Check and tidy up ------------------------------------------
	fmt.Println("== 6. Checks")
	// The Router Acks after the handler returns: wait for the last Acks to
	// reach the server before closing.
	want := int64(len(published) - 8)
	for sub.Stats().Acked < want {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the Acks: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := router.Close(); err != nil {
		return err
	}
	st := sub.Stats()
	dead, err := client.Exists(ctx, topic+valkeystream.DefaultDeadLetterSuffix).Result()
	if err != nil {
		return err
	}
	summary, err = client.XPending(ctx, topic, group).Result()
	if err != nil {
		return err
	}
	by := map[string]int{}
	for _, who := range handled {
		by[who]++
	}
	fmt.Printf("   %d orders published, %d handled (%d by watermill-redisstream, %d by valkeystream, %d of them reclaimed)\n",
		len(published), len(handled), by["watermill-redisstream"], by["valkeystream"], st.Reclaimed)
	fmt.Printf("   undecodable entries: %d; dead-letter stream exists: %v; still pending: %d\n", st.InvalidEntries, dead == 1, summary.Count)
	if len(handled) != len(published) || st.InvalidEntries != 0 || dead != 0 || summary.Count != 0 || st.Reclaimed == 0 {
		return errors.New("the migration lost, dead-lettered or left behind a message, or reclaimed nothing")
	}

	// The dead consumer's name stays in the group, holding nothing. Remove
	// names only when they hold zero pending entries: deleting a consumer
	// deletes its pending list.
	consumers, err := client.XInfoConsumers(ctx, topic, group).Result()
	if err != nil {
		return err
	}
	sort.Slice(consumers, func(i, j int) bool { return consumers[i].Name < consumers[j].Name })
	for _, c := range consumers {
		if c.Name == "billing-1" || c.Pending != 0 {
			continue
		}
		if err := client.XGroupDelConsumer(ctx, topic, group, c.Name).Err(); err != nil {
			return err
		}
		fmt.Printf("   XGROUP DELCONSUMER %s %s %s (it held 0 pending entries)\n", topic, group, c.Name)
	}
	fmt.Println("   every order handled, none dead-lettered, nothing pending")
	return nil
}

// next returns the next message from msgs.
func next(ctx context.Context, msgs <-chan *message.Message) (*message.Message, error) {
	select {
	case msg, ok := <-msgs:
		if !ok {
			return nil, errors.New("the subscription ended early")
		}
		return msg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
