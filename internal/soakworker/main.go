// Command soakworker is the service of the chaos soak (soak_test.go): one
// process that runs, through one client and one Watermill router, every
// feature of valkeystream at once on one server (or cluster):
//
//   - transform: a partitioned topic (-partitioned, -partitions N) read
//     through consumer group -transform-group, each input turned into one
//     output on -output (metadata "input", "input_entry" and
//     "input_stream": the input's UUID, entry id and partition stream)
//     under the ExactlyOnce middleware. The handler checks
//     msg.Context().Err() before anything else, as docs/partitions.md
//     ("Fencing") tells handlers to, and writes keyed lines to the
//     -partition-ledger (internal/audit: B, then H or R), one handling at a
//     time in the process, so that the partitioned crash audit's judge can
//     read them. With -retry-prob a handling asks for a retry
//     (valkeystream.RetryAfter, a plain Nack on a partitioned topic)
//     instead. With -output-per-slot each output goes instead to the
//     output topic of its input's hash tag, "<output>{<tag>}", published
//     by the handler with the input's context (it joins the step): on a
//     cluster every key of a step must lie in the input's slot.
//   - plain: the topic -plain read through consumer group -plain-group,
//     through the Deduplicator (outermost), then the DeadLetter middleware
//     (-max-deliveries), then the handler, which acts on the message's
//     "soak_kind" metadata: "retry" asks, on its first delivery, to come
//     back after "soak_retry_after" (valkeystream.RetryAfter); "poison"
//     fails unless its UUID is in the set -fixed-key on the server; any
//     other is handled. Lines go to the -ledger (internal/soakledger): B
//     when the handler begins, then H, R or F; after the middlewares, M (or
//     L when the Deduplicator found its in-progress mark lost) when the
//     message was marked done, D when it was dead-lettered. The plain
//     group's handlings run one at a time, so the Deduplicator's counters
//     tell what each one did.
//   - fan-out: the topic -plain read without a consumer group from its
//     head, an S line per message in the -ledger.
//
// The client is a *redis.Client of -addr, or with -cluster a
// *redis.ClusterClient of the nodes -addr lists; -dial maps addresses to
// the ones dialed instead, so that each node of a cluster is reached
// through a proxy of the worker's own, which the test can cut.
//
// Once its router runs it logs the consumer name each group subscription
// took ("soakworker: transform subscribed as consumer <name>": its member
// id on the partitioned topic). It stops gracefully (the router closes,
// sending what it has not sent yet,
// exit status 0) when its standard input reaches end of file, and then
// prints its counters on one line beginning "soakworker: stats " (JSON).
// Exit statuses: 0 after a graceful stop, 1 when a ledger cannot be
// written, 2 for bad arguments or a failed start, 3 when a handler of the
// router stopped by itself, 4 for a message of the wrong partition.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/soakledger"
)

// Metadata keys the soak's publisher sets on the plain topic's messages.
const (
	metaKind       = "soak_kind"
	metaRetryAfter = "soak_retry_after"
)

var (
	errRetry  = errors.New("soakworker: a retry asked for")
	errPoison = errors.New("soakworker: poison message, not fixed yet")
)

type config struct {
	addrs    []string
	dial     map[string]string // address -> the proxy to dial instead
	cluster  bool
	consumer string
	seed     uint64
	tp       topics
	h        handling
	t        timings

	verbose bool
}

// topics are the worker's topics and groups.
type topics struct {
	partitioned  string
	partitions   int
	transformTo  string
	perSlot      bool
	transformGrp string
	plain        string
	plainGroup   string
	fixedKey     string
}

// handling is how the worker's handlers behave.
type handling struct {
	maxDeliveries int
	handleTime    time.Duration
	retryProb     float64
	retryAfter    time.Duration
}

// timings are the worker's Subscriber and Deduplicator settings.
type timings struct {
	block, claimInterval, claimMinIdle, ackFlush, leaseTTL, ownerTTL, runningTTL time.Duration
	batch                                                                        int64
}

func main() {
	var c config
	var addrs, dial, partitionLedger, ledgerPath string
	flag.StringVar(&addrs, "addr", "", "server host:port, or the nodes of a cluster, comma-separated (with -cluster)")
	flag.BoolVar(&c.cluster, "cluster", false, "the server is a cluster")
	flag.StringVar(&dial, "dial", "", "addresses to dial instead of others: node=proxy, comma-separated (the nodes of a cluster, each through a proxy)")
	flag.StringVar(&c.consumer, "consumer", "", "consumer name (the base of the leased names) of both groups")
	flag.Uint64Var(&c.seed, "seed", 1, "seed of the handlers' random choices")
	flag.StringVar(&c.tp.partitioned, "partitioned", "", "the partitioned input topic")
	flag.IntVar(&c.tp.partitions, "partitions", 0, "its partition count")
	flag.StringVar(&c.tp.transformTo, "output", "", "the output topic of the transform")
	flag.BoolVar(&c.tp.perSlot, "output-per-slot", false, "publish each output to the output topic of its input's hash tag")
	flag.StringVar(&c.tp.transformGrp, "transform-group", "transform", "consumer group of the partitioned topic")
	flag.StringVar(&c.tp.plain, "plain", "", "the plain topic (consumer group and fan-out)")
	flag.StringVar(&c.tp.plainGroup, "plain-group", "plain", "consumer group of the plain topic")
	flag.StringVar(&c.tp.fixedKey, "fixed-key", "", "server set of the UUIDs of poison messages that are fixed")
	flag.IntVar(&c.h.maxDeliveries, "max-deliveries", 3, "DeadLetterConfig.MaxDeliveries")
	flag.DurationVar(&c.h.handleTime, "handle-time", time.Millisecond, "every transform handling takes this long")
	flag.Float64Var(&c.h.retryProb, "retry-prob", 0, "probability that a transform handling asks for a retry")
	flag.DurationVar(&c.h.retryAfter, "retry-after", 50*time.Millisecond, "the retry-after of -retry-prob")
	flag.DurationVar(&c.t.block, "block", 200*time.Millisecond, "SubscriberConfig.BlockTime")
	flag.DurationVar(&c.t.claimInterval, "claim-interval", 300*time.Millisecond, "SubscriberConfig.ClaimInterval")
	flag.DurationVar(&c.t.claimMinIdle, "claim-min-idle", 1500*time.Millisecond, "SubscriberConfig.ClaimMinIdle")
	flag.DurationVar(&c.t.ackFlush, "ack-flush", 100*time.Millisecond, "SubscriberConfig.AckFlushInterval")
	flag.DurationVar(&c.t.leaseTTL, "lease-ttl", 500*time.Millisecond, "SubscriberConfig.ConsumerLeaseTTL")
	flag.DurationVar(&c.t.ownerTTL, "partition-ttl", time.Second, "SubscriberConfig.PartitionOwnerTTL")
	flag.DurationVar(&c.t.runningTTL, "running-ttl", 3*time.Second, "DedupConfig.RunningTTL")
	flag.Int64Var(&c.t.batch, "batch", 0, "SubscriberConfig.BatchSize (0: default)")
	flag.StringVar(&partitionLedger, "partition-ledger", "", "ledger of the transform (internal/audit), to create")
	flag.StringVar(&ledgerPath, "ledger", "", "ledger of the plain group and the fan-out (internal/soakledger), to create")
	flag.BoolVar(&c.verbose, "v", false, "log at debug level")
	flag.Parse()
	c.addrs = strings.Split(addrs, ",")
	c.dial = map[string]string{}
	for _, pair := range strings.Split(dial, ",") {
		if from, to, ok := strings.Cut(pair, "="); ok {
			c.dial[from] = to
		} else if pair != "" {
			fail(2, fmt.Errorf("-dial: %q is not node=proxy", pair))
		}
	}
	if addrs == "" || c.consumer == "" || c.tp.partitioned == "" || c.tp.partitions < 1 || c.tp.transformTo == "" ||
		c.tp.plain == "" || c.tp.fixedKey == "" || partitionLedger == "" || ledgerPath == "" {
		fail(2, errors.New("-addr, -consumer, -partitioned, -partitions, -output, -plain, -fixed-key, -partition-ledger and -ledger are required"))
	}
	pl, err := audit.Create(partitionLedger)
	if err != nil {
		fail(2, err)
	}
	l, err := soakledger.Create(ledgerPath)
	if err != nil {
		fail(2, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	os.Exit(run(ctx, c, pl, l))
}

// fail ends the process with status after printing err.
func fail(status int, err error) {
	fmt.Fprintln(os.Stderr, "soakworker:", err)
	os.Exit(status)
}

// service is what the handlers share.
type service struct {
	c      config
	client redis.UniversalClient
	dedup  *valkeystream.Deduplicator
	pub    *valkeystream.Publisher

	// transformMu makes the transform's handlings one at a time, so that
	// its ledger's B and H lines pair up.
	transformMu sync.Mutex
	pl          *audit.Writer
	rng         *rand.Rand // under transformMu

	// plainMu makes the plain group's handlings one at a time, so that the
	// Deduplicator's counters around one tell what it did.
	plainMu sync.Mutex
	l       *soakledger.Writer

	fenced, transformed, retried atomic.Int64
	handled, failed, asked       atomic.Int64
	seen                         atomic.Int64
}

func run(ctx context.Context, c config, pl *audit.Writer, l *soakledger.Writer) int {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	dialVia := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if to, ok := c.dial[addr]; ok {
			addr = to
		}
		return dialer.DialContext(ctx, network, addr)
	}
	var client redis.UniversalClient
	if c.cluster {
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs, Dialer: dialVia})
	} else {
		client = redis.NewClient(&redis.Options{Addr: c.addrs[0], Dialer: dialVia})
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, c.verbose, false)
	s := &service{c: c, client: client, pl: pl, l: l, rng: rand.New(rand.NewPCG(c.seed, c.seed^0x50a4))}

	partitions := map[string]int{c.tp.partitioned: c.tp.partitions}
	group := func(name string) valkeystream.SubscriberConfig {
		return valkeystream.SubscriberConfig{
			Client: client, ConsumerGroup: name, Consumer: c.consumer, Start: valkeystream.StartHead,
			BatchSize: c.t.batch, BlockTime: c.t.block, ClaimInterval: c.t.claimInterval, ClaimMinIdle: c.t.claimMinIdle,
			AckFlushInterval: c.t.ackFlush, ConsumerLeaseTTL: c.t.leaseTTL,
		}
	}
	tc := group(c.tp.transformGrp)
	tc.Partitions, tc.PartitionOwnerTTL = partitions, c.t.ownerTTL
	transformSub, err := valkeystream.NewSubscriber(tc, logger)
	if err != nil {
		fail(2, err)
	}
	plainSub, err := valkeystream.NewSubscriber(group(c.tp.plainGroup), logger)
	if err != nil {
		fail(2, err)
	}
	fanOut, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, Start: valkeystream.StartHead, BlockTime: c.t.block,
	}, logger)
	if err != nil {
		fail(2, err)
	}
	s.pub, err = valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: partitions}, logger)
	if err != nil {
		fail(2, err)
	}
	x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: s.pub}, logger)
	if err != nil {
		fail(2, err)
	}
	s.dedup, err = valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: client, RunningTTL: c.t.runningTTL}, logger)
	if err != nil {
		fail(2, err)
	}
	deadLetter, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: s.pub, MaxDeliveries: c.h.maxDeliveries}, logger)
	if err != nil {
		fail(2, err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger)
	if err != nil {
		fail(2, err)
	}

	var transform *message.Handler
	if c.tp.perSlot {
		transform = router.AddNoPublisherHandler("transform", c.tp.partitioned, retrying{transformSub, ctx},
			func(m *message.Message) error {
				outs, err := s.transform(m)
				if err != nil {
					return err
				}
				for _, out := range outs {
					out.SetContext(m.Context()) // the input's: the output joins the step
				}
				return s.pub.Publish(slotTopic(c.tp.transformTo, m), outs...)
			})
	} else {
		transform = router.AddHandler("transform", c.tp.partitioned, retrying{transformSub, ctx}, c.tp.transformTo, s.pub, s.transform)
	}
	transform.AddMiddleware(x.Middleware)
	plain := router.AddNoPublisherHandler("plain", c.tp.plain, retrying{plainSub, ctx}, s.plain)
	plain.AddMiddleware(s.recordMarks, s.dedup.Middleware, deadLetter)
	fan := router.AddNoPublisherHandler("fan-out", c.tp.plain, retrying{fanOut, ctx}, s.fanOut)

	var stopping atomic.Bool
	ended := make(chan string, 3)
	go func() {
		<-router.Running()
		for _, h := range []struct {
			name string
			h    *message.Handler
		}{{"transform", transform}, {"plain", plain}, {"fan-out", fan}} {
			go func() {
				<-h.h.Stopped()
				ended <- h.name
			}()
		}
	}()
	go func() {
		<-ctx.Done()
		stopping.Store(true)
		if err := router.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "soakworker: closing the router:", err)
		}
	}()
	go func() {
		<-router.Running()
		for _, st := range transformSub.Subscriptions() {
			fmt.Fprintf(os.Stderr, "soakworker: transform subscribed as consumer %s\n", st.Consumer)
		}
		for _, st := range plainSub.Subscriptions() {
			fmt.Fprintf(os.Stderr, "soakworker: plain subscribed as consumer %s\n", st.Consumer)
		}
	}()
	// A handler that stops while the process is not stopping ends it: a
	// subscription must never end by itself.
	go func() {
		name := <-ended
		if !stopping.Load() {
			fmt.Fprintf(os.Stderr, "soakworker: the %s handler stopped by itself\n", name)
			os.Exit(3)
		}
	}()
	runErr := router.Run(context.Background())
	status := 0
	switch {
	case runErr != nil && stopping.Load():
		fmt.Fprintf(os.Stderr, "soakworker: %s stopped before its router ran: %v\n", c.consumer, runErr)
	case runErr != nil:
		fmt.Fprintln(os.Stderr, "soakworker: router:", runErr)
		status = 2
	case !stopping.Load():
		fmt.Fprintln(os.Stderr, "soakworker: the router stopped by itself")
		status = 3
	}
	_ = client.Close()
	_ = pl.Close()
	_ = l.Close()

	stats := workerStats{
		handlerCounts: handlerCounts{
			Fenced: s.fenced.Load(), Transformed: s.transformed.Load(), TransformRetries: s.retried.Load(),
			Handled: s.handled.Load(), Failed: s.failed.Load(), RetriesAsked: s.asked.Load(), Seen: s.seen.Load(),
		},
		Partitions: transformSub.PartitionStats(), TransformNacks: transformSub.Stats().Nacks,
		PlainNacks: plainSub.Stats().Nacks, Dedup: s.dedup.Stats(), ExactlyOnce: x.Stats(),
		Faults: transformSub.Stats().Faults + plainSub.Stats().Faults + fanOut.Stats().Faults,
	}
	b, err := json.Marshal(stats)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakworker:", err)
	}
	fmt.Fprintf(os.Stderr, "soakworker: stats %s\n", b)
	return status
}

// workerStats is what a worker prints when it stops gracefully: its
// handlers' counts (flat in the JSON) and the library's.
type workerStats struct {
	handlerCounts
	Faults         int64 // the three subscriptions' Stats().Faults
	Partitions     valkeystream.PartitionStats
	TransformNacks valkeystream.NackStats
	PlainNacks     valkeystream.NackStats
	Dedup          valkeystream.DedupStats
	ExactlyOnce    valkeystream.ExactlyOnceStats
}

// handlerCounts are what the worker's handlers counted.
type handlerCounts struct {
	Fenced           int64 // transform messages taken with their context ended (not handled)
	Transformed      int64 // transform handlings that returned an output
	TransformRetries int64
	Handled          int64 // plain handlings that succeeded
	Failed           int64 // plain handlings of poison messages that failed
	RetriesAsked     int64 // plain handlings that asked for a retry
	Seen             int64 // fan-out messages
}

// transform is the partitioned topic's handler: one output per input.
func (s *service) transform(m *message.Message) ([]*message.Message, error) {
	s.transformMu.Lock()
	defer s.transformMu.Unlock()
	if err := m.Context().Err(); err != nil {
		// The partition may be another subscription's now: it handles this
		// message (docs/partitions.md, "Fencing"). Nothing is written.
		s.fenced.Add(1)
		return nil, err
	}
	id := m.Metadata.Get(valkeystream.MetadataEntryID)
	count := valkeystream.DeliveryCount(m)
	key := m.Metadata.Get(valkeystream.MetadataPartitionKey)
	seq, err := strconv.Atoi(m.Metadata.Get("seq"))
	if err != nil {
		fail(2, fmt.Errorf("message %s (entry %s) has no sequence number: %w", m.UUID, id, err))
	}
	if got, want := m.Metadata.Get(valkeystream.MetadataPartition), strconv.Itoa(valkeystream.PartitionOf(key, s.c.tp.partitions)); got != want {
		fail(4, fmt.Errorf("message %s (entry %s, key %q) delivered from partition %q, its key's is %s", m.UUID, id, key, got, want))
	}
	write := func(kind byte) {
		if err := s.pl.Keyed(kind, m.UUID, id, count, key, seq); err != nil {
			fail(1, err)
		}
	}
	write(audit.Began)
	time.Sleep(s.c.h.handleTime)
	if s.c.h.retryProb > 0 && s.rng.Float64() < s.c.h.retryProb {
		write(audit.Retried)
		s.retried.Add(1)
		return nil, valkeystream.RetryAfter(m, s.c.h.retryAfter, errRetry)
	}
	out := message.NewMessage(watermill.NewUUID(), append([]byte("out:"), m.Payload...))
	out.Metadata.Set("input", m.UUID)
	out.Metadata.Set("input_entry", id)
	out.Metadata.Set("input_stream", m.Metadata.Get(valkeystream.MetadataStream))
	write(audit.Handled)
	s.transformed.Add(1)
	return []*message.Message{out}, nil
}

// slotTopic is the output topic of the input m's hash tag.
func slotTopic(output string, m *message.Message) string {
	stream := m.Metadata.Get(valkeystream.MetadataStream)
	if i := strings.IndexByte(stream, '{'); i >= 0 {
		if j := strings.IndexByte(stream[i:], '}'); j > 0 {
			return output + stream[i:i+j+1]
		}
	}
	return output
}

// recordMarks, outside the Deduplicator, writes what it did with the
// handling that just ended: marked done (M, or L when its in-progress mark
// was lost meanwhile) or given up to the dead letters (D).
func (s *service) recordMarks(h message.HandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		s.plainMu.Lock()
		defer s.plainMu.Unlock()
		before := s.dedup.Stats()
		out, err := h(m)
		after := s.dedup.Stats()
		kind := byte(0)
		switch {
		case after.GivenUp > before.GivenUp:
			kind = soakledger.GivenUp
		case after.Marked > before.Marked && after.LostMarks > before.LostMarks:
			kind = soakledger.MarkedLate
		case after.Marked > before.Marked:
			kind = soakledger.Marked
		}
		if kind != 0 {
			s.line(kind, m)
		}
		return out, err
	}
}

// plain is the plain group's handler.
func (s *service) plain(m *message.Message) error {
	s.line(soakledger.Began, m)
	switch m.Metadata.Get(metaKind) {
	case "retry":
		if valkeystream.DeliveryCount(m) == 1 {
			d, err := time.ParseDuration(m.Metadata.Get(metaRetryAfter))
			if err != nil {
				fail(2, fmt.Errorf("message %s: %s: %w", m.UUID, metaRetryAfter, err))
			}
			s.line(soakledger.Retried, m)
			s.asked.Add(1)
			return valkeystream.RetryAfter(m, d, errRetry)
		}
	case "poison":
		fixed, err := s.client.SIsMember(m.Context(), s.c.tp.fixedKey, m.UUID).Result()
		if err != nil || !fixed {
			s.line(soakledger.Failed, m)
			s.failed.Add(1)
			return errors.Join(errPoison, err)
		}
	}
	s.line(soakledger.Handled, m)
	s.handled.Add(1)
	return nil
}

// fanOut is the fan-out subscription's handler.
func (s *service) fanOut(m *message.Message) error {
	s.line(soakledger.Seen, m)
	s.seen.Add(1)
	return nil
}

func (s *service) line(kind byte, m *message.Message) {
	if err := s.l.Write(kind, m.UUID, m.Metadata.Get(valkeystream.MetadataEntryID), valkeystream.DeliveryCount(m),
		m.Metadata.Get(valkeystream.MetadataConsumer)); err != nil {
		fail(1, err)
	}
}

// retrying is a Subscriber whose Subscribe is tried again for a while, as a
// service would: a worker may start while the server restarts or its
// network is cut.
type retrying struct {
	*valkeystream.Subscriber
	stop context.Context // the worker is asked to stop: give up at once
}

func (r retrying) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		msgs, err := r.Subscriber.Subscribe(ctx, topic)
		if err == nil || r.stop.Err() != nil || time.Now().After(deadline) {
			return msgs, err
		}
		fmt.Fprintf(os.Stderr, "soakworker: subscribing to %s failed, trying again: %v\n", topic, err)
		select {
		case <-r.stop.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
