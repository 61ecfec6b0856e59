package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
)

// Partitioned topics (SubscriberConfig.Partitions): what a partitioned
// topic costs one subscription against a plain topic (the partition-cost
// scenario), and how its throughput scales with the subscriptions of a
// group when the handler is slow (partition-scale-router and
// partition-scale-channel).

// The partitioned sides of the partition-cost scenario: valkeystream with
// the topic partitioned 1 and 8 ways, one subscription, unkeyed messages
// (spread over the partitions in turn).
const (
	sidePartitions1 = "valkeystream+1-partition"
	sidePartitions8 = "valkeystream+8-partitions"
)

var (
	partitions1Side = partitionedSide(sidePartitions1, 1)
	partitions8Side = partitionedSide(sidePartitions8, 8)
)

// partitionedSide is valkeystream's side on a topic of n partitions: the
// documented configuration with Partitions on the Publisher and the
// Subscriber, defaults otherwise.
func partitionedSide(name string, n int) side {
	return side{
		name:       name,
		partitions: n,
		prefill: func(ctx context.Context, sc *scope, topic string, c corpus) (message.Subscriber, error) {
			parts := map[string]int{topic: n}
			pub, err := newPartitionedPublisher(sc, parts)
			if err != nil {
				return nil, err
			}
			if err := publishCorpus(ctx, pub, topic, c); err != nil {
				return nil, err
			}
			return newPartitionedSubscriber(sc, parts, "")
		},
	}
}

func newPartitionedPublisher(sc *scope, parts map[string]int) (*valkeystream.Publisher, error) {
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: sc.client(), Partitions: parts}, nil)
	if err != nil {
		return nil, fmt.Errorf("creating the partitioned valkeystream publisher: %w", err)
	}
	sc.onClose("partitioned valkeystream publisher", pub.Close)
	return pub, nil
}

// newPartitionedSubscriber makes a Subscriber of the partitioned topics
// parts on a client of its own; consumer is its consumer name ("": the
// default).
func newPartitionedSubscriber(sc *scope, parts map[string]int, consumer string) (*valkeystream.Subscriber, error) {
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client:        sc.client(),
		ConsumerGroup: group,
		Consumer:      consumer,
		Start:         valkeystream.StartHead,
		Partitions:    parts,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("creating the partitioned valkeystream subscriber: %w", err)
	}
	sc.onClose("partitioned valkeystream subscriber", sub.Close)
	return sub, nil
}

// streamsOf returns the streams a consume run of sd on topic reads: the
// topic's, or its partitions'.
func (sd side) streamsOf(topic string) []string {
	if sd.partitions == 0 {
		return []string{topic}
	}
	streams, err := valkeystream.PartitionStreams(topic, sd.partitions)
	if err != nil {
		panic(err) // the sides' counts are valid
	}
	return streams
}

// isPartitionCost reports whether scn compares partitioned topics with a
// plain one.
func (scn scenario) isPartitionCost() bool {
	return slices.Contains(scn.sides, sidePartitions1) || slices.Contains(scn.sides, sidePartitions8)
}

// The scale scenarios: a topic of scalePartitions partitions, messages
// keyed by a key of their own (so spread evenly), a handler that sleeps
// scaleHandler, and 1, 2, 4, 8 subscriptions (-partition-subscriptions),
// each on a Subscriber and a client of its own, all in this process.
const (
	scalePartitions = 16
	scaleHandler    = time.Millisecond
	// scaleSettle bounds the wait for the subscriptions to split the
	// partitions evenly before the clock starts.
	scaleSettle = 30 * time.Second
)

// scaleSample is one run of a scale scenario.
type scaleSample struct {
	scenario string
	router   bool
	subs     int
	delay    time.Duration
	n        int
	elapsed  time.Duration // from the first Publish call to the last message handled
	settle   time.Duration // from the first Subscribe to the even split
	owned    []int64       // partitions each subscription owned when the clock started
	dups     int64
	pending  int64
}

func (s scaleSample) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.n) / s.elapsed.Seconds()
}

// runScaleScenario runs a scale scenario once for each count of
// subscriptions.
func (b *bench) runScaleScenario(ctx context.Context, scn scenario, rep int) error {
	for _, k := range rotate(b.cfg.partitionSubs, rep) {
		s, err := b.runScale(ctx, scn, k, rep)
		if err != nil {
			return fmt.Errorf("%s, %d subscriptions, repetition %d: %w", scn.id, k, rep+1, err)
		}
		b.scale = append(b.scale, s)
		fmt.Fprintf(b.progress, "rep %d/%d %-24s %d subscriptions: %9s msg/s  (%d in %s; split %v in %s)%s\n",
			rep+1, b.cfg.reps, scn.id, k, formatRate(s.rate()), s.n, s.elapsed.Round(time.Millisecond),
			s.owned, s.settle.Round(time.Millisecond), sampleNotes(sample{duplicates: s.dups, pending: s.pending}))
	}
	return nil
}

// runScale starts k subscriptions of a new topic of scalePartitions
// partitions, waits until they split the partitions evenly, then starts
// the clock and publishes the corpus (one goroutine, batches of
// c.fillBatch()), each message with its own partition key, and stops it
// when every message was handled: each handling sleeps scaleHandler, then
// succeeds.
func (b *bench) runScale(ctx context.Context, scn scenario, k, rep int) (scaleSample, error) {
	n := b.cfg.partitionN
	if b.dist.delay > 0 && b.cfg.distanceMessages > 0 {
		n = min(n, b.cfg.distanceMessages)
	}
	c, err := newCorpus(uint64(rep)<<32|uint64(k), n, 64)
	if err != nil {
		return scaleSample{}, err
	}
	sc := newScope(b.dist.addr)
	defer sc.close()
	b.runs++
	topic := fmt.Sprintf("bench-%s-%d-%d", scn.id, k, b.runs)
	streams, err := valkeystream.PartitionStreams(topic, scalePartitions)
	if err != nil {
		return scaleSample{}, err
	}
	defer b.cleanupStreams(ctx, streams)
	parts := map[string]int{topic: scalePartitions}
	pub, err := newPartitionedPublisher(sc, parts)
	if err != nil {
		return scaleSample{}, err
	}
	tr := newTracker(c, false)
	work := func(msg *message.Message) {
		time.Sleep(scaleHandler)
		handle(tr, msg, false)
	}
	subs := make([]*valkeystream.Subscriber, k)
	for i := range subs {
		if subs[i], err = newPartitionedSubscriber(sc, parts, fmt.Sprintf("scale-%d", i)); err != nil {
			return scaleSample{}, err
		}
	}
	if err := sc.warm(ctx, 4); err != nil {
		return scaleSample{}, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, k)
	began := time.Now()
	for i, sub := range subs {
		if scn.scaleRouter {
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
			if err != nil {
				return scaleSample{}, err
			}
			router.AddConsumerHandler(fmt.Sprintf("scale-%d", i), topic, sub, func(msg *message.Message) error {
				work(msg)
				return nil
			})
			stopRouter, err := runRouter(runCtx, router, 10*time.Second)
			if err != nil {
				return scaleSample{}, err
			}
			defer func() { _ = stopRouter() }()
			continue
		}
		msgs, err := sub.Subscribe(runCtx, topic)
		if err != nil {
			return scaleSample{}, fmt.Errorf("subscribing: %w", err)
		}
		wg.Go(func() {
			for msg := range msgs {
				work(msg)
				msg.Ack()
			}
			if runCtx.Err() == nil {
				errs <- errors.New("a subscription closed its channel before every message arrived")
			}
		})
	}
	defer wg.Wait()
	defer stop()

	s := scaleSample{scenario: scn.id, router: scn.scaleRouter, subs: k, delay: b.dist.delay, n: n}
	if s.owned, err = waitEvenSplit(ctx, subs, scalePartitions, scaleSettle); err != nil {
		return scaleSample{}, err
	}
	s.settle = time.Since(began)

	published := make(chan error, 1)
	tr.begin()
	go func() {
		batch := c.fillBatch()
		for from := 0; from < c.n; from += batch {
			msgs := c.messages(from, min(from+batch, c.n))
			for j, m := range msgs {
				m.Metadata.Set(valkeystream.MetadataPartitionKey, fmt.Sprintf("key-%d", from+j))
			}
			if err := pub.Publish(topic, msgs...); err != nil {
				published <- fmt.Errorf("publishing: %w", err)
				return
			}
		}
		published <- nil
	}()
	waitCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	go func() {
		select {
		case err := <-errs:
			fail(err)
		case <-waitCtx.Done():
		}
	}()
	if err := tr.wait(waitCtx, b.cfg.stall); err != nil {
		if cause := context.Cause(waitCtx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		return scaleSample{}, err
	}
	if err := <-published; err != nil {
		return scaleSample{}, err
	}
	s.elapsed = tr.elapsed()
	s.dups = tr.duplicates.Load()
	if s.pending, err = b.pendingAfter(ctx, streams...); err != nil {
		return scaleSample{}, err
	}
	if s.pending > 0 {
		b.describePending(ctx, streams...)
	}
	return s, nil
}

// waitEvenSplit waits until the subscriptions of subs (one each) own all n
// partitions between them, evenly (each n/k or n/k+1), and returns what
// each owns.
func waitEvenSplit(ctx context.Context, subs []*valkeystream.Subscriber, n int, bound time.Duration) ([]int64, error) {
	deadline := time.Now().Add(bound)
	k := int64(len(subs))
	for {
		owned := make([]int64, len(subs))
		var sum int64
		even := true
		for i, sub := range subs {
			owned[i] = sub.PartitionStats().Owned
			sum += owned[i]
			if owned[i] < int64(n)/k || owned[i] > (int64(n)+k-1)/k {
				even = false
			}
		}
		if even && sum == int64(n) {
			return owned, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the %d subscriptions did not split the %d partitions evenly within %s: they own %v", k, n, bound, owned)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cleanupStreams deletes a run's partition streams and, where allowed,
// empties the server.
func (b *bench) cleanupStreams(ctx context.Context, streams []string) {
	if ctx.Err() != nil {
		return
	}
	err := b.admin.Del(ctx, streams...).Err()
	if err == nil {
		err = b.srv.reset(ctx, b.admin)
	}
	if err != nil {
		fmt.Fprintf(b.progress, "warning: cleaning up partition streams: %v\n", err)
	}
}

// writePartitionCost reports, for the partition-cost scenario, each
// side's rate and allocations per message, and each partitioned side's
// rate over the plain topic's, with the paired ratios of each repetition.
func (r report) writePartitionCost(w *strings.Builder) {
	rows := r.costRows(scenario.isPartitionCost, func(name string) bool { return name != sideValkeystream })
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Cost of partitioned topics\n\nOne Subscriber through a router (a handler that returns nil), as in\n"+
		"the consume-router scenario, on a plain topic (`%s`) and on the same\n"+
		"corpus published to a topic of 1 and of 8 partitions (`Partitions` on\n"+
		"the Publisher and the Subscriber; the messages carry no partition key,\n"+
		"so they go to the partitions in turn). A partition is handled in order,\n"+
		"one message in flight; the subscription runs one loop per partition it\n"+
		"owns. The clock runs from `Subscribe` (the router's start)\n"+
		"to the last message handled, so it includes taking the partitions.\n"+
		"Allocations are the whole process' during the timed part, per message,\n"+
		"median over the runs. The ratio is the partitioned rate over the plain\n"+
		"one; the paired ratios divide the runs of each repetition.\n\n", sideValkeystream)
	w.WriteString("| payload | round trip | side | msg/s | runs | allocs/msg | bytes/msg | partitioned / plain | paired ratios |\n")
	w.WriteString("|---:|---:|---|---:|---|---:|---:|---:|---|\n")
	w.WriteString(strings.Join(rows, "\n") + "\n\n")
}

// scaleKey names the scale runs whose figures are pooled.
type scaleKey struct {
	scenario string
	delay    time.Duration
	subs     int
}

// writeScale reports the scale scenarios: the median rate at each count
// of subscriptions, its runs, and its ratio to linear scaling from one
// subscription (the median rate of one times the count).
func (r report) writeScale(w *strings.Builder) {
	if len(r.samples.scale) == 0 {
		return
	}
	runs := map[scaleKey][]scaleSample{}
	for _, s := range r.samples.scale {
		k := scaleKey{s.scenario, s.delay, s.subs}
		runs[k] = append(runs[k], s)
	}
	medianOf := func(ss []scaleSample) float64 {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = s.rate()
		}
		return median(xs)
	}
	fmt.Fprintf(w, "### Scaling with subscriptions on a partitioned topic\n\n"+
		"A topic of %d partitions; each message has a partition key of its own,\n"+
		"so the messages spread evenly; the handler sleeps %s, then succeeds.\n"+
		"1 to 8 subscriptions of one group, each on a Subscriber and a client of\n"+
		"its own, in this one process: through a router each\n"+
		"(`partition-scale-router`: the router runs a handler per message it is\n"+
		"given, so a subscription handles each of its partitions' messages at\n"+
		"once, up to one per partition) or read from the channel one message at a\n"+
		"time, Acked after the handler (`partition-scale-channel`: one message in\n"+
		"flight per subscription). The subscriptions start on the empty topic and\n"+
		"the clock starts once they split the partitions evenly; then one\n"+
		"goroutine publishes %s messages, %d per call, and the clock stops at\n"+
		"the last one handled. \"Linear\" is the rate over one subscription's\n"+
		"median rate times the count. Figures are medians over %s.\n\n",
		scalePartitions, scaleHandler, groupThousands(int64(r.cfg.partitionN)), prefillBatch, plural(r.cfg.reps, "run"))
	w.WriteString("| consumer | round trip | subscriptions | split | msg/s | runs | of linear |\n")
	w.WriteString("|---|---:|---:|---|---:|---|---:|\n")
	for _, scn := range r.scenarios {
		if scn.kind != kindScale {
			continue
		}
		for _, delay := range r.cfg.delays {
			one := medianOf(runs[scaleKey{scn.id, delay, 1}])
			for _, k := range r.cfg.partitionSubs {
				ss := runs[scaleKey{scn.id, delay, k}]
				if len(ss) == 0 {
					continue
				}
				rate := medianOf(ss)
				cells := make([]string, len(ss))
				for i, s := range ss {
					cells[i] = formatRate(s.rate())
				}
				linear := "–"
				if one > 0 {
					linear = formatPercent(ratio(rate, one*float64(k)))
				}
				split := strings.Trim(strings.ReplaceAll(fmt.Sprint(ss[0].owned), " ", "+"), "[]")
				fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s |\n",
					scn.id, r.rttCell(delay), k, split, formatRate(rate), strings.Join(cells, ", "), linear)
			}
		}
	}
	w.WriteString("\n")
}
