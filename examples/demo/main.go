// Command demo walks through valkeystream, the Watermill Pub/Sub for Redis
// and Valkey Streams with consumer groups, showing what you would want to see
// before trusting it:
//
//  1. it finds a server (see ../internal/devserver);
//  2. a Publisher writes several messages in one Publish call;
//  3. a Watermill Router consumes them through a consumer group; its handler
//     fails twice on one message, the Router Nacks it, and the subscriber
//     delivers it again with the server's delivery count growing 1, 2, 3;
//  4. a consumer "crashes" with messages it never acknowledged, comes back
//     under the same name, and gets exactly those messages first;
//  5. it prints a summary. Nothing is left pending.
//
// Run it from the repository root:
//
//	go run -C examples ./demo
//
// Environment:
//
//	VALKEYSTREAM_ADDR=host:port  use that server instead of starting one
//	VALKEYSTREAM_DEMO_LOG=1      print Watermill's and valkeystream's logs
//
// The demo checks what it shows: if the library behaves differently from what
// is printed here, it says so and exits with status 1.
package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/examples/internal/devserver"
)

const (
	// group is the consumer group every subscriber of the demo reads through.
	group = "demo"
	// timeout bounds the whole demo, so that it never hangs; the happy path
	// takes a couple of seconds.
	timeout = 30 * time.Second
)

func main() {
	if err := run(); err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "demo interrupted:", err)
		} else {
			fmt.Fprintln(os.Stderr, "demo failed:", err)
		}
		os.Exit(1)
	}
}

func run() error {
	// Ctrl-C, or the overall timeout, ends every wait below; the deferred
	// calls then close what was opened.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if os.Getenv("VALKEYSTREAM_DEMO_LOG") != "" {
		logger = watermill.NewStdLogger(false, false)
	}

	// ---- 1. Server ---------------------------------------------------------
	fmt.Println("== 1. Server")
	srv, err := devserver.Start(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	fmt.Printf("   using %s at %s\n", srv.About, srv.Addr)

	// One go-redis client serves the publisher, every subscriber and the
	// XPENDING checks. valkeystream never closes a client it was given
	// (unless CloseClient is set), so the demo closes it.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer client.Close()

	// A Watermill topic is one stream key. A fresh name per run keeps runs
	// against a shared server apart. The library never deletes a stream or a
	// group; the demo removes its own stream (and with it the group) at the
	// end.
	topic := fmt.Sprintf("valkeystream-demo-%06x", rand.Uint32()&0xffffff)
	defer func() {
		delCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		client.Del(delCtx, topic)
	}()

	// ---- 2. Publish --------------------------------------------------------
	fmt.Println("== 2. Publish")
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()

	orders := newMessages("order-1", "order-2", "order-3", "order-4")
	// One Publish call: the XADDs go to the server in one pipelined round
	// trip, in order. The message UUID is stored with each entry; it is the
	// key to deduplicate on, since delivery is at-least-once.
	if err := pub.Publish(topic, orders...); err != nil {
		return err
	}
	fmt.Printf("   published %d messages to topic %q in one Publish call: %s\n",
		len(orders), topic, payloads(orders))

	// ---- 3. Router, with a handler that fails twice ------------------------
	fmt.Printf("== 3. Consume through a Watermill Router (group %q, consumer \"demo-1\", StartHead)\n", group)
	flaky := orders[1]
	counts, err := consumeWithRouter(ctx, client, logger, topic, orders, flaky.UUID)
	if err != nil {
		return err
	}
	if !slices.Equal(counts, []int{1, 2, 3}) {
		return fmt.Errorf("expected %s to be delivered with counts [1 2 3], saw %v", flaky.Payload, counts)
	}

	// ---- 4. A consumer restarts with unacknowledged messages ---------------
	fmt.Println("== 4. Restart: a consumer stops without acking, then comes back under the same name")
	invoices := newMessages("invoice-1", "invoice-2", "invoice-3")
	if err := pub.Publish(topic, invoices...); err != nil {
		return err
	}
	fmt.Printf("   published %d more messages: %s\n", len(invoices), payloads(invoices))
	cameBack, err := restart(ctx, client, logger, topic, invoices)
	if err != nil {
		return err
	}

	// ---- 5. Summary --------------------------------------------------------
	fmt.Println("== 5. Summary")
	fmt.Printf("   OK on %s: %d messages published and acknowledged; %s was Nacked twice and succeeded on delivery 3; "+
		"what a consumer held unacknowledged (%d) came back first after its restart, with delivery count 2; nothing is pending.\n",
		srv.About, len(orders)+len(invoices), flaky.Payload, cameBack)
	return nil
}

// consumeWithRouter runs a Watermill Router whose one handler reads topic
// through a valkeystream Subscriber, until every published message has been
// handled and acknowledged. The handler fails the first two times it sees the
// message with UUID flakyUUID. consumeWithRouter returns the delivery counts
// that message was seen with.
func consumeWithRouter(ctx context.Context, client redis.UniversalClient, logger watermill.LoggerAdapter,
	topic string, published []*message.Message, flakyUUID string) ([]int, error) {
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: group,
		Consumer:      "demo-1",
		// Start is required. StartHead makes the new group begin at the
		// stream's head, so it sees the messages published before it
		// existed. (StartNew would skip them.)
		Start: valkeystream.StartHead,
	}, logger)
	if err != nil {
		return nil, err
	}
	// The Router closes its subscribers when it closes; closing twice is
	// fine, and this covers the early returns.
	defer sub.Close()

	// No Retry middleware: a handler error makes the Router Nack the
	// message, and the Nack reaches the subscriber, which delivers the entry
	// again at once (NackResendDelay is 0 by default).
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: timeout}, logger)
	if err != nil {
		return nil, err
	}

	var (
		mu          sync.Mutex
		flakyCounts []int               // delivery counts the flaky message arrived with
		done        = map[string]bool{} // UUIDs handled successfully
		handled     sync.WaitGroup      // one per published message
	)
	handled.Add(len(published))

	router.AddConsumerHandler("demo-handler", topic, sub, func(msg *message.Message) error {
		// The subscriber sets the server's delivery count on every message.
		n := valkeystream.DeliveryCount(msg)
		mu.Lock()
		defer mu.Unlock()
		if msg.UUID == flakyUUID {
			flakyCounts = append(flakyCounts, n)
			if len(flakyCounts) <= 2 {
				fmt.Printf("   %-9s delivery %d -> handler returns an error; the Router Nacks it\n", msg.Payload, n)
				return errors.New("simulated failure")
			}
		}
		fmt.Printf("   %-9s delivery %d -> handled; the Router Acks it\n", msg.Payload, n)
		// Delivery is at-least-once: count each message once, by UUID.
		if !done[msg.UUID] {
			done[msg.UUID] = true
			handled.Done()
		}
		return nil
	})

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()

	allHandled := make(chan struct{})
	go func() { handled.Wait(); close(allHandled) }()

	select {
	case <-allHandled:
	case err := <-routerDone:
		return nil, fmt.Errorf("the router stopped before every message was handled: %v", err)
	case <-ctx.Done():
		router.Close()
		return nil, fmt.Errorf("timed out waiting for the router to handle every message: %w", ctx.Err())
	}

	// The handler signals a moment before the Router Acks the message (the
	// Router Acks after the handler returns). Stopping the Router right away
	// could cut that last Ack off, and the entry would then come again later
	// (delivery is at-least-once). So wait until the subscriber reports every
	// Ack sent to the server (XACK, batched within AckFlushInterval).
	if err := waitUntil(ctx, "the Acks to reach the server", func() bool {
		return sub.Stats().Acked >= int64(len(published))
	}); err != nil {
		router.Close()
		return nil, err
	}
	if err := router.Close(); err != nil {
		return nil, fmt.Errorf("closing the router: %w", err)
	}
	if err := <-routerDone; err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	st := sub.Stats()
	fmt.Printf("   all %d messages handled; router closed (subscriber stats: %d deliveries, %d Nacks, %d Acks)\n",
		len(published), st.Delivered, st.Nacks.Nacked, st.Acked)

	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(flakyCounts), nil
}

// restart shows what happens to messages a consumer received but never
// acknowledged: they stay in the group's pending entries list (PEL) under
// the consumer's name, and a consumer that starts again under that name gets
// them back before anything new.
func restart(ctx context.Context, client *redis.Client, logger watermill.LoggerAdapter,
	topic string, published []*message.Message) (cameBack int, err error) {
	config := valkeystream.SubscriberConfig{
		Client:        client,
		ConsumerGroup: group,
		// The consumer's name is what ties it to its pending entries. In
		// production it must be stable across restarts (the default is the
		// host name).
		Consumer: "demo-2",
		Start:    valkeystream.StartHead,
	}

	// First run: take a message and never settle it. NoCloseGrace makes
	// Close give up on it at once, as a crash would (by default Close waits
	// up to CloseGrace, 5 s, for the message in the handler's hands).
	crashing := config
	crashing.CloseGrace = valkeystream.NoCloseGrace
	first, err := valkeystream.NewSubscriber(crashing, logger)
	if err != nil {
		return 0, err
	}
	defer first.Close()
	msgs, err := first.Subscribe(ctx, topic)
	if err != nil {
		return 0, err
	}
	msg, err := receive(ctx, msgs)
	if err != nil {
		return 0, err
	}
	fmt.Printf("   [demo-2, first run]  received %-9s delivery %d, and does not Ack it\n",
		msg.Payload, valkeystream.DeliveryCount(msg))
	// A subscription hands the application one message at a time (the next
	// comes after the previous is Acked or Nacked) and reads ahead only what
	// its handler settles soon: before the first message is settled, one
	// entry. The server counts what it read as delivered to demo-2. Ask it
	// directly.
	pending, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: topic, Group: group, Consumer: "demo-2", Start: "-", End: "+", Count: 100,
	}).Result()
	if err != nil {
		return 0, err
	}
	fmt.Printf("   XPENDING: %d entries pending for demo-2 (what it read; it hands them over one at a time):\n", len(pending))
	for _, p := range pending {
		fmt.Printf("     entry %s  delivery count %d\n", p.ID, p.RetryCount)
	}
	if len(pending) == 0 || pending[0].ID != msg.Metadata.Get(valkeystream.MetadataEntryID) {
		return 0, fmt.Errorf("expected the entry of %s pending for demo-2, XPENDING shows %d entries", msg.Payload, len(pending))
	}
	if err := first.Close(); err != nil {
		return 0, err
	}
	fmt.Println("   closed the subscriber with nothing acknowledged: to the server this is a crash")

	// Second run, same consumer name: before reading anything new, the
	// subscription drains its own pending entries (XREADGROUP ... 0). The
	// server counts that as another delivery; entries it never read before
	// come on their first.
	second, err := valkeystream.NewSubscriber(config, logger)
	if err != nil {
		return 0, err
	}
	defer second.Close()
	msgs, err = second.Subscribe(ctx, topic)
	if err != nil {
		return 0, err
	}
	for i, want := range published {
		msg, err := receive(ctx, msgs)
		if err != nil {
			return 0, err
		}
		n := valkeystream.DeliveryCount(msg)
		fmt.Printf("   [demo-2, second run] received %-9s delivery %d -> Ack\n", msg.Payload, n)
		msg.Ack()
		wantCount := 1
		if i < len(pending) {
			wantCount = 2 // it was pending for demo-2
		}
		if msg.UUID != want.UUID || n != wantCount {
			return 0, fmt.Errorf("message %d after the restart: expected %s with delivery count %d, got %s with %d",
				i+1, want.Payload, wantCount, msg.Payload, n)
		}
	}
	// Acks are sent in batches; Close sends those not sent yet, so every
	// Ack made before Close reaches the server.
	if err := second.Close(); err != nil {
		return 0, err
	}

	// The group's pending list, straight from the server.
	summary, err := client.XPending(ctx, topic, group).Result()
	if err != nil {
		return 0, err
	}
	fmt.Printf("   closed the subscriber (Close sends the Acks not sent yet); XPENDING %s %s: %d entries pending\n",
		topic, group, summary.Count)
	if summary.Count != 0 {
		return 0, fmt.Errorf("expected nothing pending in group %q, XPENDING shows %d entries", group, summary.Count)
	}
	return len(pending), nil
}

// newMessages returns one message per payload, each with a fresh UUID.
func newMessages(payloads ...string) []*message.Message {
	msgs := make([]*message.Message, len(payloads))
	for i, p := range payloads {
		msgs[i] = message.NewMessage(watermill.NewUUID(), message.Payload(p))
	}
	return msgs
}

// payloads lists the messages' payloads, for printing.
func payloads(msgs []*message.Message) string {
	s := ""
	for i, m := range msgs {
		if i > 0 {
			s += ", "
		}
		s += string(m.Payload)
	}
	return s
}

// receive waits for the next message of a subscription.
func receive(ctx context.Context, msgs <-chan *message.Message) (*message.Message, error) {
	select {
	case msg, ok := <-msgs:
		if !ok {
			return nil, errors.New("the subscription ended before the expected message arrived")
		}
		return msg, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("timed out waiting for a message: %w", ctx.Err())
	}
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s: %w", what, ctx.Err())
		}
	}
	return nil
}
