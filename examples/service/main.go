// Command service is an order service built on Watermill's CQRS component
// over valkeystream, set up as docs/service.md recommends:
//
//   - one consumer group per event handler (billing, shipping,
//     schedule-reminder, send-reminder), so that each sees every event;
//   - every handler wrapped, outermost first, in valkeystream's
//     Deduplicator, valkeystream.DeadLetter, middleware.Retry (which leaves
//     a handler's verdicts alone) and middleware.Recoverer;
//   - billing gives up at once on an invalid order (valkeystream.GiveUp),
//     asks for a later redelivery when the bank is busy
//     (valkeystream.RetryAfter), and fails on customer "poison" until the
//     key shop:rules:poison-fixed exists, so that those orders end as dead
//     letters to replay with `valkeystream dead replay OrderPlaced --all`;
//   - a payment reminder published with Watermill's delay metadata, held on
//     the server until it is due;
//   - Prometheus metrics (/metrics) and probes (/livez, /readyz) on one HTTP
//     server;
//   - a graceful shutdown on SIGINT or SIGTERM.
//
// Its effects are keys in the server (see orders.go). Run it from the
// repository root:
//
//	go run -C examples ./service
//
// It uses the server at -addr (or VALKEYSTREAM_ADDR) if set, else starts a
// private valkey-server or redis-server, else an embedded miniredis, and
// serves HTTP at -http (or SERVICE_HTTP_ADDR; default 127.0.0.1:8080); its
// first line names both. On a server it started itself it publishes a few
// sample orders; -sample-orders sets how many. -h lists the flags; see
// README.md beside this file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/examples/internal/devserver"
	"github.com/echomq/valkeystream/metrics"
)

// maxDeliveries is the delivery on which a failure is final: the message is
// dead-lettered then.
const maxDeliveries = 3

// shutdownTimeout bounds each step of the shutdown.
const shutdownTimeout = 10 * time.Second

func main() {
	addr := devserver.AddrFlag()
	httpAddr := flag.String("http", envOr("SERVICE_HTTP_ADDR", "127.0.0.1:8080"), "address of the HTTP server (/metrics, /livez, /readyz; default $SERVICE_HTTP_ADDR, else 127.0.0.1:8080; port 0 picks a free one)")
	o := options{}
	flag.DurationVar(&o.reminderDelay, "reminder-delay", 5*time.Second, "how long after an order its payment reminder is due")
	flag.IntVar(&o.samples, "sample-orders", -1, "sample orders to publish at start (-1: 10 on a server the service started itself, else 0)")
	flag.BoolVar(&o.verbose, "v", false, "print Watermill's and valkeystream's logs")
	flag.BoolVar(&o.handlers, "handlers", true, "run the handlers; false: a monitoring instance, which serves /metrics on the handlers' groups and handles nothing")
	flag.DurationVar(&o.sampleInterval, "sample-interval", metrics.DefaultSampleInterval, "how often /metrics samples the streams and groups on the server")
	flag.Parse()
	o.httpAddr = *httpAddr
	if err := devserver.UseAddr(*addr); err != nil {
		log.Fatal(err)
	}

	logger := log.New(os.Stdout, "service: ", log.Ltime|log.Lmicroseconds)
	if err := run(logger, o); err != nil {
		logger.Print("failed: ", err)
		os.Exit(1)
	}
}

// options are the service's flags.
type options struct {
	httpAddr       string
	reminderDelay  time.Duration
	samples        int
	verbose        bool
	handlers       bool
	sampleInterval time.Duration
}

func run(logger *log.Logger, o options) error {
	verbose, samples := o.verbose, o.samples
	// SIGINT or SIGTERM cancels ctx; the shutdown below follows.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var wlog watermill.LoggerAdapter = watermill.NopLogger{}
	if verbose {
		wlog = watermill.NewStdLogger(false, false)
	}

	srv, err := devserver.Start(ctx)
	if err != nil {
		return err
	}
	defer srv.Stop()
	samples = srv.Samples(samples, 10)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer client.Close()
	if !o.handlers {
		return monitor(ctx, logger, srv, client, o)
	}

	// One Publisher for the events and the dead letters. The EventBus
	// writes through Watermill's delay publisher, which turns a delay in
	// the context into the delay metadata valkeystream honours.
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, wlog)
	if err != nil {
		return err
	}
	bus, err := newEventBus(pub)
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: shutdownTimeout}, wlog)
	if err != nil {
		return err
	}
	dedup, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: client}, wlog)
	if err != nil {
		return err
	}
	// The dead-lettering is said on the console with or without -v.
	var dlog watermill.LoggerAdapter = consoleLog{logger}
	if verbose {
		dlog = wlog
	}
	deadLetter, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{
		Publisher:     pub,
		MaxDeliveries: maxDeliveries,
	}, dlog)
	if err != nil {
		return err
	}
	retry := middleware.Retry{
		MaxRetries:      2,
		InitialInterval: 10 * time.Millisecond,
		Multiplier:      2,
		// A verdict (RetryAfter, GiveUp) is final for this delivery.
		ShouldRetry: func(p middleware.RetryParams) bool { return !valkeystream.IsFinal(p.Err) },
		Logger:      wlog,
	}
	// Outermost first: the Deduplicator must see the delivery's outcome
	// after the dead-lettering, DeadLetter the error left after the
	// retries, and Retry a panic as an error.
	router.AddMiddleware(dedup.Middleware, deadLetter, retry.Middleware, middleware.Recoverer)

	// One consumer group per handler, named after it: handlers sharing a
	// group would split the events between them.
	subs := map[string]*valkeystream.Subscriber{}
	processor, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(p cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) {
			return p.EventName, nil
		},
		SubscriberConstructor: func(p cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
				Client:        client,
				ConsumerGroup: p.HandlerName,
				Start:         valkeystream.StartHead,
			}, wlog)
			if err != nil {
				return nil, err
			}
			subs[p.HandlerName] = sub
			return sub, nil
		},
		Marshaler: marshaler,
		Logger:    wlog,
	})
	if err != nil {
		return err
	}
	h := &handlers{client: client, bus: bus, reminderDelay: o.reminderDelay, logger: logger}
	if err := processor.AddHandlers(h.eventHandlers()...); err != nil {
		return err
	}
	defer func() {
		for _, sub := range subs {
			_ = sub.Close()
		}
	}()

	// Metrics and probes, on one HTTP server.
	collector, err := metrics.NewCollector(metrics.Config{Client: client, SampleInterval: o.sampleInterval})
	if err != nil {
		return err
	}
	var all []*valkeystream.Subscriber
	for name, sub := range subs {
		if err := collector.AddSubscriber(name, sub); err != nil {
			return err
		}
		all = append(all, sub)
	}
	if err := collector.AddPublisher("events", pub); err != nil {
		return err
	}
	if err := collector.AddDeduplicator("handlers", dedup); err != nil {
		return err
	}
	registry := prometheus.NewRegistry()
	if err := registry.Register(collector); err != nil {
		return err
	}
	health, err := valkeystream.NewHealthCheck(valkeystream.HealthConfig{Subscribers: all})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/livez", health.LiveHandler())
	mux.Handle("/readyz", health.ReadyHandler())
	httpServer, httpDone, err := serve(logger, srv, o.httpAddr, mux)
	if err != nil {
		return err
	}

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}
	logger.Printf("running %d handlers, one consumer group each", len(subs))
	if samples > 0 {
		if err := publishSamples(ctx, bus, samples); err != nil {
			return err
		}
		logger.Printf("published %d sample orders (a poison one among them); Ctrl-C to stop", samples)
	}

	select {
	case <-ctx.Done():
		logger.Print("stopping")
	case err := <-routerDone:
		return fmt.Errorf("router stopped: %w", err)
	case err := <-httpDone:
		return fmt.Errorf("HTTP server: %w", err)
	}

	// The shutdown: the router first (its handlers finish and their
	// messages are acknowledged), then the HTTP server, then the
	// Subscribers and the Publisher.
	var errs []error
	if err := router.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the router: %w", err))
	}
	if err := <-routerDone; err != nil {
		errs = append(errs, fmt.Errorf("router: %w", err))
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		errs = append(errs, fmt.Errorf("shutting down the HTTP server: %w", err))
	}
	for name, sub := range subs {
		if err := sub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing subscriber %s: %w", name, err))
		}
	}
	if err := pub.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the publisher: %w", err))
	}
	if len(errs) == 0 {
		logger.Print("stopped")
	}
	return errors.Join(errs...)
}

// marshaler names each event by its type name (OrderPlaced), which is
// also its topic.
var marshaler = cqrs.JSONMarshaler{GenerateName: cqrs.StructName}

// newEventBus returns the bus the service (and its test) publishes events
// on. Each event's message UUID derives from its order, so that a
// deduplicating handler recognises an event published twice (as after a
// crash between a handler's publish and its Ack).
func newEventBus(pub message.Publisher) (*cqrs.EventBus, error) {
	delayed, err := delay.NewPublisher(pub, delay.PublisherConfig{AllowNoDelay: true})
	if err != nil {
		return nil, err
	}
	return cqrs.NewEventBusWithConfig(delayed, cqrs.EventBusConfig{
		GeneratePublishTopic: func(p cqrs.GenerateEventPublishTopicParams) (string, error) {
			return p.EventName, nil
		},
		OnPublish: func(p cqrs.OnEventSendParams) error {
			switch e := p.Event.(type) {
			case *OrderPlaced:
				p.Message.UUID = "order-" + e.OrderID
			case *PaymentReminderDue:
				p.Message.UUID = "reminder-" + e.OrderID
			}
			return nil
		},
		Marshaler: marshaler,
	})
}

// publishSamples publishes n sample orders: one for the poison customer,
// one for the busy one, the others ordinary.
func publishSamples(ctx context.Context, bus *cqrs.EventBus, n int) error {
	stamp := time.Now().Format("150405")
	for i := range n {
		o := &OrderPlaced{OrderID: fmt.Sprintf("%s-%d", stamp, i), Customer: "alice", Cents: int64(100 + i)}
		switch i {
		case 1:
			o.Customer = poisonCustomer
		case 2:
			o.Customer = busyCustomer
		}
		if err := bus.Publish(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// consoleLog is the DeadLetter middleware's logger without -v: its Info and
// Error lines (a message dead-lettered, or a dead letter that could not be
// written) on the service's console, its Debug and Trace lines dropped.
type consoleLog struct{ logger *log.Logger }

func (l consoleLog) Error(msg string, err error, fields watermill.LogFields) {
	l.logger.Printf("%s: %v %v", msg, err, map[string]any(fields))
}

func (l consoleLog) Info(msg string, fields watermill.LogFields) {
	l.logger.Printf("%s %v", msg, map[string]any(fields))
}

func (consoleLog) Debug(string, watermill.LogFields) {}
func (consoleLog) Trace(string, watermill.LogFields) {}

func (l consoleLog) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return withFields{l, fields}
}

// withFields is a consoleLog with fields added to every line.
type withFields struct {
	consoleLog
	fields watermill.LogFields
}

func (l withFields) Error(msg string, err error, fields watermill.LogFields) {
	l.consoleLog.Error(msg, err, l.fields.Add(fields))
}

func (l withFields) Info(msg string, fields watermill.LogFields) {
	l.consoleLog.Info(msg, l.fields.Add(fields))
}

func (l withFields) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return withFields{l.consoleLog, l.fields.Add(fields)}
}

// serve serves mux at addr and prints the service's first line, which names
// the server and the HTTP address; the channel gets Serve's error.
func serve(logger *log.Logger, srv *devserver.Server, addr string, mux *http.ServeMux) (*http.Server, <-chan error, error) {
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("serving HTTP at %s (-http or SERVICE_HTTP_ADDR; port 0 picks a free one): %w", addr, err)
	}
	httpServer := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- httpServer.Serve(listener) }()
	logger.Printf("server: %s at %s (the valkeystream command: VALKEYSTREAM_ADDR=%s); HTTP: http://%s (/metrics, /livez, /readyz)",
		srv.About, srv.Addr, srv.Addr, listener.Addr())
	return httpServer, done, nil
}

// monitor runs a monitoring instance: /metrics samples the groups of the
// service's handlers on the server (Collector.WatchGroup), as an exporter
// beside the workers would, and nothing is handled; /livez and /readyz
// answer 200.
func monitor(ctx context.Context, logger *log.Logger, srv *devserver.Server, client redis.UniversalClient, o options) error {
	collector, err := metrics.NewCollector(metrics.Config{Client: client, SampleInterval: o.sampleInterval})
	if err != nil {
		return err
	}
	for _, h := range (&handlers{}).eventHandlers() {
		collector.WatchGroup(marshaler.Name(h.NewEvent()), h.HandlerName())
	}
	registry := prometheus.NewRegistry()
	if err := registry.Register(collector); err != nil {
		return err
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"monitoring":true}`)) })
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/livez", ok)
	mux.Handle("/readyz", ok)
	httpServer, httpDone, err := serve(logger, srv, o.httpAddr, mux)
	if err != nil {
		return err
	}
	logger.Print("monitoring the handlers' consumer groups; handling nothing")
	select {
	case <-ctx.Done():
	case err := <-httpDone:
		return fmt.Errorf("HTTP server: %w", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down the HTTP server: %w", err)
	}
	logger.Print("stopped")
	return nil
}
