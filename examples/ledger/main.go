// Command ledger applies account events to balances, exactly once, with
// valkeystream:
//
//   - deposits and withdrawals arrive on the partitioned topic
//     ledger.events (12 partitions, keyed by account), so the events of
//     one account are applied one at a time, in order, however many
//     workers run;
//   - a Watermill router handler under the ExactlyOnce middleware reads the
//     account's balance and writes the new one, records the event as
//     applied and returns a BalanceChanged event for ledger.balance-changed:
//     the writes (valkeystream.StepOf) and the output join the step that
//     acknowledges the event, so a worker killed at any moment neither
//     loses an event nor applies one twice;
//   - a graceful shutdown on SIGINT or SIGTERM.
//
// Its state is keys in the server: ledger:balance:<account> (cents) and
// ledger:applied:<account> (event id -> times applied). Run it from the
// repository root:
//
//	go run -C examples ./ledger
//
// It uses the server at -addr (or VALKEYSTREAM_ADDR) if set, else starts a
// private valkey-server or redis-server. On a server it started itself it
// publishes a few sample events; -publish sets how many. Run several
// workers against one server, each with its own -consumer, and they split
// the partitions. -h lists the flags; see README.md beside this file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/examples/internal/devserver"
)

// shutdownTimeout bounds the router's wait for the handlers in flight.
const shutdownTimeout = 10 * time.Second

// options are the worker's flags.
type options struct {
	consumer string
	publish  int
	accounts int
	ownerTTL time.Duration
	verbose  bool
}

func main() {
	host, _ := os.Hostname()
	addr := devserver.AddrFlag()
	o := options{}
	flag.StringVar(&o.consumer, "consumer", envOr("LEDGER_CONSUMER", host), "this worker's consumer name in group "+group+" (default $LEDGER_CONSUMER, else the host name)")
	flag.IntVar(&o.publish, "publish", -1, "sample events to publish at start (-1: 200 on a server the worker started itself, else 0)")
	flag.IntVar(&o.accounts, "accounts", 10, "accounts the sample events are spread over")
	flag.DurationVar(&o.ownerTTL, "owner-ttl", valkeystream.DefaultPartitionOwnerTTL, "how long the partitions of a worker that died wait before the others take them over (PartitionOwnerTTL)")
	flag.BoolVar(&o.verbose, "v", false, "print Watermill's and valkeystream's logs")
	flag.Parse()
	if err := devserver.UseAddr(*addr); err != nil {
		log.Fatal(err)
	}
	logger := log.New(os.Stdout, "ledger: ", log.Ltime|log.Lmicroseconds)
	if err := run(logger, o); err != nil {
		logger.Print("failed: ", err)
		os.Exit(1)
	}
}

func run(logger *log.Logger, o options) error {
	// SIGINT or SIGTERM cancels ctx; the shutdown below follows.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.accounts < 1 {
		return fmt.Errorf("-accounts is %d: give at least 1", o.accounts)
	}

	var wlog watermill.LoggerAdapter = watermill.NopLogger{}
	if o.verbose {
		wlog = watermill.NewStdLogger(false, false)
	}
	srv, err := devserver.Start(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	o.publish = srv.Samples(o.publish, 200)
	// A subscription keeps up to half of the pool in blocking reads, one
	// per partition it owns: room for all of them.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4 * partitions})
	defer client.Close()

	declared := map[string]int{eventsTopic: partitions}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: declared}, wlog)
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:            client,
		ConsumerGroup:     group,
		Consumer:          o.consumer,
		Start:             valkeystream.StartHead,
		Partitions:        declared,
		PartitionOwnerTTL: o.ownerTTL,
	}, wlog)
	if err != nil {
		return fmt.Errorf("subscriber: %w", err)
	}
	defer sub.Close()
	// The Publisher writes the handler's outputs inside the step; it shares
	// the Subscriber's client, as the step needs.
	exactlyOnce, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, wlog)
	if err != nil {
		return fmt.Errorf("exactly-once middleware: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: shutdownTimeout}, wlog)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	router.AddHandler("apply", eventsTopic, sub, changedTopic, pub, ledger{client: client}.apply).
		AddMiddleware(middleware.Recoverer, exactlyOnce.Middleware) // ExactlyOnce last, next to the handler

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}
	logger.Printf("worker %s: %s at %s (the valkeystream command: VALKEYSTREAM_ADDR=%s); applying %s (%d partitions, group %s), publishing to %s",
		o.consumer, srv.About, srv.Addr, srv.Addr, eventsTopic, partitions, group, changedTopic)
	if o.publish > 0 {
		msgs, err := sampleEvents("sample-"+time.Now().Format("150405.000"), o.publish, o.accounts)
		if err != nil {
			return err
		}
		if err := pub.Publish(eventsTopic, msgs...); err != nil {
			return fmt.Errorf("publishing sample events: %w", err)
		}
		logger.Printf("published %d sample events over %d accounts; Ctrl-C to stop", o.publish, o.accounts)
	}

	select {
	case <-ctx.Done():
		logger.Print("stopping")
	case err := <-routerDone:
		return fmt.Errorf("router stopped: %w", err)
	}
	// The router first (its handlers finish, their steps commit), then the
	// Subscriber and the Publisher.
	var errs []error
	if err := router.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the router: %w", err))
	}
	if err := <-routerDone; err != nil {
		errs = append(errs, fmt.Errorf("router: %w", err))
	}
	if err := sub.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the subscriber: %w", err))
	}
	if err := pub.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the publisher: %w", err))
	}
	if len(errs) == 0 {
		logger.Print("stopped")
	}
	return errors.Join(errs...)
}

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
