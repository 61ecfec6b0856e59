// Command crashworker is the consumer process of the crash audit
// (crash_audit_test.go). It subscribes to one topic through a consumer group
// and, for every message, appends a line to its ledger (see internal/audit)
// when the handler begins and another when it has finished, before the Ack.
// The test kills it with SIGKILL at random moments and reads the ledgers back.
//
// With -dedup the handler runs inside valkeystream's Deduplicator, and a
// third line records that the message was marked done, after the mark and
// before the Ack. A delivery the Deduplicator turns away (another handling
// is in progress) is Nacked.
//
// It stops gracefully (Close sends the Acks not sent yet, exit status 0) when
// its standard input reaches end of file: the test closes the pipe, or the
// test process died, so a worker never outlives its test.
//
// With -stall the handler never finishes: the worker holds what it read until
// it is killed, for tests of what a restart gets back.
//
// With -transform-to the worker is a transform stage (crash_transform_test.go):
// a Watermill router handler that, after the same ledger lines and delays,
// returns one output message per input, with the input's UUID in metadata
// key "input", which the router publishes to the -transform-to topic through
// a valkeystream Publisher on the worker's client, before the input's Ack.
// With -exactly-once as well the handler is wrapped in ExactlyOnce's
// middleware: the output and the input's XACK are written in one step.
//
// With -partitions N the topic is a partitioned one of N partitions
// (SubscriberConfig.Partitions, with -partition-ttl as PartitionOwnerTTL),
// for the partitioned crash audit (crash_partitioned_test.go): every message
// carries its partition key (valkeystream.MetadataPartitionKey) and its
// sequence number within the key (metadata "seq"), and the ledger lines are
// keyed ones (audit.Writer.Keyed), stamped with the wall clock. A message
// delivered with a MetadataPartition other than its key's partition ends
// the worker with status 4. A message whose context has ended when the
// handler begins (its partition may be another member's: the worker was
// frozen past its ownership) is Nacked without a ledger line, as the docs
// tell handlers of partitioned topics to do.
//
// -handle-time makes every handling take that long (a sleep between the
// ledger's B and H lines), on top of the random delays. With -retry-prob the
// handler, with that probability, asks for the message to come back in
// -retry-after instead of finishing it (valkeystream.NackAfter; an R line
// instead of the H): on a partitioned topic the retry must not let the
// key's next message overtake it.
//
// Exit statuses: 0 after a graceful stop, 1 when the ledger cannot be
// written, 2 for bad arguments or a failed start, 3 when the subscription
// ended by itself, 4 for a message of the wrong partition.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
)

// errStalled is what a stalled handler (-stall) returns once the process is
// told to stop: its message is left unsettled.
var errStalled = errors.New("stalled")

// errRetry is what the handler returns when it asks for a retry
// (-retry-prob).
var errRetry = errors.New("retry asked for")

func main() {
	var (
		addr          = flag.String("addr", "", "server host:port")
		topic         = flag.String("topic", "", "topic to subscribe to")
		group         = flag.String("group", "", "consumer group")
		consumer      = flag.String("consumer", "", "consumer name")
		ledgerPath    = flag.String("ledger", "", "ledger file to create")
		seed          = flag.Uint64("seed", 1, "seed of the handler delays")
		delayProb     = flag.Float64("delay-prob", 0.2, "probability that the handler sleeps")
		delayMax      = flag.Duration("delay-max", 5*time.Millisecond, "longest handler sleep")
		batch         = flag.Int64("batch", 0, "SubscriberConfig.BatchSize (0: default)")
		prefetch      = flag.Duration("prefetch", 0, "SubscriberConfig.PrefetchWindow (0: default, -1ns: FullBatches)")
		readAhead     = flag.Int64("read-ahead-bytes", 0, "SubscriberConfig.ReadAheadBytes (0: default, -1: NoReadAheadLimit)")
		block         = flag.Duration("block", 200*time.Millisecond, "SubscriberConfig.BlockTime")
		claimInterval = flag.Duration("claim-interval", 300*time.Millisecond, "SubscriberConfig.ClaimInterval")
		claimMinIdle  = flag.Duration("claim-min-idle", 1500*time.Millisecond, "SubscriberConfig.ClaimMinIdle")
		ackFlush      = flag.Duration("ack-flush", 100*time.Millisecond, "SubscriberConfig.AckFlushInterval")
		leaseTTL      = flag.Duration("lease-ttl", 0, "SubscriberConfig.ConsumerLeaseTTL (0: default)")
		stall         = flag.Bool("stall", false, "never finish a message: the handler waits until the process ends")
		dedup         = flag.Bool("dedup", false, "run the handler inside the Deduplicator")
		runningTTL    = flag.Duration("running-ttl", time.Second, "DedupConfig.RunningTTL (with -dedup)")
		verbose       = flag.Bool("v", false, "log at debug level")
		baseline      = flag.Bool("baseline-verbs", false, "SubscriberConfig.BaselineVerbs")
		transformTo   = flag.String("transform-to", "", "run a router handler that returns one output per input (metadata \"input\": the input's UUID), published to this topic")
		exactlyOnce   = flag.Bool("exactly-once", false, "with -transform-to: wrap the handler in ExactlyOnce.Middleware")
		partitions    = flag.Int("partitions", 0, "the topic's partition count (SubscriberConfig.Partitions; 0: not partitioned); keyed ledger lines")
		partitionTTL  = flag.Duration("partition-ttl", 0, "SubscriberConfig.PartitionOwnerTTL (0: default)")
		handleTime    = flag.Duration("handle-time", 0, "every handling sleeps this long")
		retryProb     = flag.Float64("retry-prob", 0, "probability that the handler asks for a retry (NackAfter) instead of finishing")
		retryAfter    = flag.Duration("retry-after", 100*time.Millisecond, "the retry-after of -retry-prob")
	)
	flag.Parse()
	if *addr == "" || *topic == "" || *group == "" || *consumer == "" || *ledgerPath == "" {
		fmt.Fprintln(os.Stderr, "crashworker: -addr, -topic, -group, -consumer and -ledger are required")
		os.Exit(2)
	}
	if *transformTo == "" && *exactlyOnce {
		fmt.Fprintln(os.Stderr, "crashworker: -exactly-once needs -transform-to")
		os.Exit(2)
	}
	if *transformTo != "" && (*dedup || *stall) {
		fmt.Fprintln(os.Stderr, "crashworker: -transform-to does not go with -dedup or -stall")
		os.Exit(2)
	}
	if *retryProb > 0 && (*transformTo != "" || *dedup || *stall) {
		fmt.Fprintln(os.Stderr, "crashworker: -retry-prob does not go with -transform-to, -dedup or -stall")
		os.Exit(2)
	}
	if *partitions < 0 || (*partitions > 0 && *transformTo != "") {
		fmt.Fprintln(os.Stderr, "crashworker: -partitions must be positive and does not go with -transform-to")
		os.Exit(2)
	}
	var partitioned map[string]int
	if *partitions > 0 {
		partitioned = map[string]int{*topic: *partitions}
	}

	ledger, err := audit.Create(*ledgerPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashworker:", err)
		os.Exit(2)
	}
	client := redis.NewClient(&redis.Options{Addr: *addr})
	logger := watermill.NewStdLoggerWithOut(os.Stderr, *verbose, false)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:            client,
		ConsumerGroup:     *group,
		Consumer:          *consumer,
		Start:             valkeystream.StartHead,
		BatchSize:         *batch,
		BlockTime:         *block,
		ClaimInterval:     *claimInterval,
		ClaimMinIdle:      *claimMinIdle,
		AckFlushInterval:  *ackFlush,
		ConsumerLeaseTTL:  *leaseTTL,
		PrefetchWindow:    *prefetch,
		ReadAheadBytes:    *readAhead,
		BaselineVerbs:     *baseline,
		Partitions:        partitioned,
		PartitionOwnerTTL: *partitionTTL,
	}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashworker:", err)
		os.Exit(2)
	}
	var dedupe *valkeystream.Deduplicator
	if *dedup {
		dedupe, err = valkeystream.NewDeduplicator(valkeystream.DedupConfig{
			Client: client, RunningTTL: *runningTTL,
		}, logger)
		if err != nil {
			fmt.Fprintln(os.Stderr, "crashworker:", err)
			os.Exit(2)
		}
	}

	ctx, stop := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	if *transformTo != "" {
		os.Exit(runTransform(ctx, transform{
			client: client, sub: sub, logger: logger, ledger: ledger,
			topic: *topic, to: *transformTo, consumer: *consumer, exactlyOnce: *exactlyOnce,
			seed: *seed, delayProb: *delayProb, delayMax: *delayMax,
		}))
	}
	// Subscribe talks to the server (the group door, the script check): on
	// a loaded machine a call may time out, so retry for a while, as a
	// service would.
	var msgs <-chan *message.Message
	for deadline := time.Now().Add(time.Minute); ; {
		msgs, err = sub.Subscribe(ctx, *topic)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			// Asked to stop while still starting: a graceful stop.
			_ = sub.Close()
			fmt.Fprintf(os.Stderr, "crashworker: %s stopped before its subscription started\n", *consumer)
			os.Exit(0)
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "crashworker: subscribe:", err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "crashworker: subscribe failed, retrying:", err)
		time.Sleep(200 * time.Millisecond)
	}
	for _, st := range sub.Subscriptions() {
		if !st.Ended {
			// The name the lease gave (-consumer, or -consumer-2, ... while
			// a killed run's lease has not lapsed): the member id on a
			// partitioned topic.
			fmt.Fprintf(os.Stderr, "crashworker: subscribed as consumer %s\n", st.Consumer)
		}
	}

	rng := rand.New(rand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15))
	// write writes the ledger line of kind for m: a keyed one on a
	// partitioned topic.
	write := func(kind byte, m *message.Message) {
		id := m.Metadata.Get(valkeystream.MetadataEntryID)
		count := valkeystream.DeliveryCount(m)
		var err error
		if *partitions > 0 {
			err = writeKeyed(ledger, kind, m, id, count, *partitions)
		} else {
			switch kind {
			case audit.Began:
				err = ledger.Begin(m.UUID, id, count)
			case audit.Handled:
				err = ledger.Handled(m.UUID, id, count)
			case audit.Retried:
				err = ledger.Retried(m.UUID, id, count)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "crashworker:", err)
			os.Exit(1)
		}
	}
	handled, retried := 0, 0
	handle := func(m *message.Message) ([]*message.Message, error) {
		write(audit.Began, m)
		if *stall {
			<-ctx.Done()
			return nil, errStalled
		}
		if *handleTime > 0 {
			time.Sleep(*handleTime)
		}
		if *delayMax > 0 && rng.Float64() < *delayProb {
			time.Sleep(time.Duration(rng.Int64N(int64(*delayMax)) + 1))
		}
		if *retryProb > 0 && rng.Float64() < *retryProb {
			write(audit.Retried, m)
			retried++
			return nil, errRetry
		}
		write(audit.Handled, m)
		handled++
		return nil, nil
	}
	if dedupe != nil {
		handle = dedupe.Middleware(handle)
	}
	fenced := 0
	for m := range msgs {
		if *partitions > 0 && m.Context().Err() != nil {
			// As a handler of a partitioned topic should: its partition
			// may be another member's now (docs/partitions.md, "Fencing"),
			// so nothing is done and nothing written.
			fenced++
			m.Nack()
			continue
		}
		var marked int64
		if dedupe != nil {
			marked = dedupe.Stats().Marked
		}
		if _, err := handle(m); err != nil {
			switch {
			case errors.Is(err, errRetry):
				valkeystream.NackAfter(m, *retryAfter)
			case !errors.Is(err, errStalled): // a stalled message is never settled
				m.Nack()
			}
			continue
		}
		if dedupe != nil && dedupe.Stats().Marked > marked {
			id := m.Metadata.Get(valkeystream.MetadataEntryID)
			if err := ledger.Marked(m.UUID, id, valkeystream.DeliveryCount(m)); err != nil {
				fmt.Fprintln(os.Stderr, "crashworker:", err)
				os.Exit(1)
			}
		}
		m.Ack()
	}

	status := 0
	if ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "crashworker: the subscription ended by itself")
		status = 3
	}
	if err := sub.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "crashworker: close:", err)
	}
	_ = client.Close()
	_ = ledger.Close()
	fmt.Fprintf(os.Stderr, "crashworker: %s handled %d messages (%d retries asked for); stats %+v\n", *consumer, handled, retried, sub.Stats())
	if *partitions > 0 {
		fmt.Fprintf(os.Stderr, "crashworker: %s partition stats %+v; %d messages skipped for their ended context\n", *consumer, sub.PartitionStats(), fenced)
	}
	if dedupe != nil {
		fmt.Fprintf(os.Stderr, "crashworker: %s deduplication stats %+v\n", *consumer, dedupe.Stats())
	}
	os.Exit(status)
}

// writeKeyed writes the keyed ledger line of kind for m, a message of a
// topic of n partitions, after checking that it came from its key's
// partition (exit status 4 if not).
func writeKeyed(ledger *audit.Writer, kind byte, m *message.Message, id string, count, n int) error {
	key := m.Metadata.Get(valkeystream.MetadataPartitionKey)
	seq, err := strconv.Atoi(m.Metadata.Get("seq"))
	if err != nil {
		return fmt.Errorf("message %s (entry %s) has no sequence number: %w", m.UUID, id, err)
	}
	if got, want := m.Metadata.Get(valkeystream.MetadataPartition), strconv.Itoa(valkeystream.PartitionOf(key, n)); got != want {
		fmt.Fprintf(os.Stderr, "crashworker: message %s (entry %s, key %q) delivered from partition %q, its key's is %s\n", m.UUID, id, key, got, want)
		os.Exit(4)
	}
	return ledger.Keyed(kind, m.UUID, id, count, key, seq)
}

// transform is what a transform stage (-transform-to) runs with.
type transform struct {
	client      *redis.Client
	sub         *valkeystream.Subscriber
	logger      watermill.LoggerAdapter
	ledger      *audit.Writer
	topic, to   string
	consumer    string
	exactlyOnce bool
	seed        uint64
	delayProb   float64
	delayMax    time.Duration
}

// runTransform runs the transform stage until ctx ends (a graceful stop:
// the router closes the subscription, which sends the Acks not sent yet) and
// returns the exit status.
func runTransform(ctx context.Context, tr transform) int {
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: tr.client}, tr.logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashworker:", err)
		return 2
	}
	var x *valkeystream.ExactlyOnce
	if tr.exactlyOnce {
		x, err = valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, tr.logger)
		if err != nil {
			fmt.Fprintln(os.Stderr, "crashworker:", err)
			return 2
		}
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, tr.logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashworker:", err)
		return 2
	}

	// The router hands each message to the handler in a goroutine of its
	// own; the subscription delivers the next one only after the Ack, but
	// the lock makes the ledger's and the delays' single use explicit.
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(tr.seed, tr.seed^0x9e3779b97f4a7c15))
	handled := 0
	handler := router.AddHandler("transform", tr.topic, retryingSubscriber{Subscriber: tr.sub, stop: ctx}, tr.to, pub,
		func(m *message.Message) ([]*message.Message, error) {
			mu.Lock()
			defer mu.Unlock()
			id := m.Metadata.Get(valkeystream.MetadataEntryID)
			count := valkeystream.DeliveryCount(m)
			if err := tr.ledger.Begin(m.UUID, id, count); err != nil {
				fmt.Fprintln(os.Stderr, "crashworker:", err)
				os.Exit(1)
			}
			if tr.delayMax > 0 && rng.Float64() < tr.delayProb {
				time.Sleep(time.Duration(rng.Int64N(int64(tr.delayMax)) + 1))
			}
			out := message.NewMessage(watermill.NewUUID(), append([]byte("out:"), m.Payload...))
			out.Metadata.Set("input", m.UUID)
			// Written before the output and the Ack: a kill after it and
			// before the commit (or the router's publish and Ack) is a
			// handling whose message comes back.
			if err := tr.ledger.Handled(m.UUID, id, count); err != nil {
				fmt.Fprintln(os.Stderr, "crashworker:", err)
				os.Exit(1)
			}
			handled++
			// Sometimes sleep after the handling too, so that kills land
			// between the handler's end and the output's write.
			if tr.delayMax > 0 && rng.Float64() < tr.delayProb {
				time.Sleep(time.Duration(rng.Int64N(int64(tr.delayMax)) + 1))
			}
			return []*message.Message{out}, nil
		})
	if x != nil {
		handler.AddMiddleware(x.Middleware)
	}

	var stopping atomic.Bool
	go func() {
		<-ctx.Done()
		stopping.Store(true)
		if err := router.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "crashworker: closing the router:", err)
		}
	}()
	runErr := router.Run(context.Background())
	status := 0
	switch {
	case runErr != nil && stopping.Load():
		// Asked to stop while still starting: a graceful stop.
		fmt.Fprintf(os.Stderr, "crashworker: %s stopped before its router ran: %v\n", tr.consumer, runErr)
	case runErr != nil:
		fmt.Fprintln(os.Stderr, "crashworker: router:", runErr)
		status = 2
	case !stopping.Load():
		fmt.Fprintln(os.Stderr, "crashworker: the router stopped by itself")
		status = 3
	}
	// The router closed the subscriber and the publisher.
	_ = tr.client.Close()
	_ = tr.ledger.Close()
	mu.Lock()
	fmt.Fprintf(os.Stderr, "crashworker: %s handled %d messages; stats %+v\n", tr.consumer, handled, tr.sub.Stats())
	mu.Unlock()
	if x != nil {
		fmt.Fprintf(os.Stderr, "crashworker: %s exactly-once stats %+v\n", tr.consumer, x.Stats())
	}
	return status
}

// retryingSubscriber retries Subscribe for a while, as the plain worker
// does: on a loaded machine a call may time out.
type retryingSubscriber struct {
	*valkeystream.Subscriber
	stop context.Context // the worker is asked to stop: give up at once
}

func (s retryingSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	for deadline := time.Now().Add(time.Minute); ; {
		msgs, err := s.Subscriber.Subscribe(ctx, topic)
		if err == nil || s.stop.Err() != nil || time.Now().After(deadline) {
			return msgs, err
		}
		fmt.Fprintln(os.Stderr, "crashworker: subscribe failed, retrying:", err)
		time.Sleep(200 * time.Millisecond)
	}
}
