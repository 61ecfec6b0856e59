package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
)

// The transform scenario: a router handler reads the pre-filled topic and
// returns one output message per input, which goes to an output topic
// through the side's Publisher. A message counts as handled once its output
// is written: after the Publisher's Publish returned (the router publishes
// what a handler returns, then Acks the input), or, for exactly-once, after
// the middleware committed the output with the input's Ack in one step.

// sideExactlyOnce is valkeystream's transform under ExactlyOnce: the same
// Subscriber, Publisher and handler as the valkeystream side, with the
// middleware around the handler.
const sideExactlyOnce = "valkeystream+exactly-once"

var exactlyOnceSide = side{
	name:       sideExactlyOnce,
	fill:       fillValkeystream,
	subscriber: newValkeystreamSubscriber,
	transform:  func(sc *scope) (transformSetup, error) { return newValkeystreamTransform(sc, true, false) },
}

// sideExactlyOnceState is the exactly-once transform whose handler also
// adds two writes to its own keys to each step (an IncrBy of a counter and
// an HSet of a hash field, see stateWrites):
// the cost of state in the step over a step without it.
const sideExactlyOnceState = "valkeystream+exactly-once+state"

var exactlyOnceStateSide = side{
	name:       sideExactlyOnceState,
	fill:       fillValkeystream,
	subscriber: newValkeystreamSubscriber,
	transform:  func(sc *scope) (transformSetup, error) { return newValkeystreamTransform(sc, true, true) },
}

// transformSetup is what a side's transform run needs: the Subscriber of
// the input, the Publisher of the outputs, and the handler's middleware
// (outermost first).
type transformSetup struct {
	sub        message.Subscriber
	pub        message.Publisher
	middleware []message.HandlerMiddleware
}

// outputTopic is the topic the transform of topic writes to.
func outputTopic(topic string) string { return topic + ".out" }

// newValkeystreamTransform makes a Subscriber and a Publisher on one client
// (ExactlyOnce needs them to share it; the plain side shares it too, so
// that the two differ only in the middleware), with ExactlyOnce when
// exactlyOnce, and two state writes in each step when state.
func newValkeystreamTransform(sc *scope, exactlyOnce, state bool) (transformSetup, error) {
	client := sc.client()
	sub, err := newValkeystreamSubscriber(sc, client)
	if err != nil {
		return transformSetup{}, err
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		return transformSetup{}, fmt.Errorf("creating the valkeystream publisher: %w", err)
	}
	sc.onClose("valkeystream publisher", pub.Close)
	setup := transformSetup{sub: sub, pub: pub}
	if exactlyOnce {
		x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, nil)
		if err != nil {
			return transformSetup{}, fmt.Errorf("creating the ExactlyOnce middleware: %w", err)
		}
		setup.middleware = []message.HandlerMiddleware{x.Middleware}
		if state {
			setup.middleware = append(setup.middleware, stateWrites)
		}
		sc.onClose("exactly-once check", func() error {
			s := x.Stats()
			if s.Failed+s.Superseded+s.NonAtomic+s.Refused > 0 {
				return fmt.Errorf("exactly-once steps not all committed: %+v", s)
			}
			if state && s.StateWrites != 2*s.Committed {
				return fmt.Errorf("exactly-once steps applied %d state writes for %d inputs, not two each", s.StateWrites, s.Committed)
			}
			return nil
		})
	}
	return setup, nil
}

// stateWrites is the handler middleware of sideExactlyOnceState, inside
// ExactlyOnce: it adds two writes to the step of each input, to the keys of
// the last hex digit of its sequence number (16 keys of each kind), then
// runs the handler.
func stateWrites(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		step, err := valkeystream.StepOf(msg.Context())
		if err != nil {
			return nil, err
		}
		if len(msg.Payload) < seqDigits {
			return nil, fmt.Errorf("payload of %d bytes: no sequence number", len(msg.Payload))
		}
		k := "bench-state:" + string(msg.Payload[seqDigits-1:seqDigits])
		if err := step.IncrBy(k+":count", 1); err != nil {
			return nil, err
		}
		if err := step.HSet(k+":last", "uuid", msg.UUID); err != nil {
			return nil, err
		}
		return h(msg)
	}
}

// newIncumbentTransform makes watermill-redisstream's Subscriber and
// Publisher, each on its own client (both close the client they are given).
func newIncumbentTransform(sc *scope) (transformSetup, error) {
	sub, err := newIncumbentSubscriber(sc, sc.client())
	if err != nil {
		return transformSetup{}, err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: sc.client()}, watermill.NopLogger{})
	if err != nil {
		return transformSetup{}, fmt.Errorf("creating the watermill-redisstream publisher: %w", err)
	}
	sc.onClose("watermill-redisstream publisher", ignoreClosed(pub.Close))
	return transformSetup{sub: sub, pub: pub}, nil
}

// transformOutput is the handler's output for msg: a new message with the
// input's UUID, payload and correlation metadata (the same work for every
// side; no new UUID is drawn, so that the handler's own cost stays small).
func transformOutput(msg *message.Message) *message.Message {
	out := message.NewMessage(msg.UUID, msg.Payload)
	out.Metadata.Set(metadataKey, msg.Metadata.Get(metadataKey))
	return out
}

// bookingPublisher books the input of each message it published as handled
// once Publish returned: the output is written.
type bookingPublisher struct {
	message.Publisher
	tr *tracker
}

func (p bookingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		if seq, ok := parseSeq(m.Payload); ok && seq < p.tr.n {
			p.tr.succeed(seq)
		}
	}
	return nil
}

// bookCommitted is the outermost middleware: a handling that succeeded and
// left nothing for the router to publish (ExactlyOnce wrote its output in
// the step) is booked as handled when it returns.
func bookCommitted(tr *tracker) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			produced, err := h(msg)
			if err == nil && len(produced) == 0 {
				if seq, ok := parseSeq(msg.Payload); ok && seq < tr.n {
					tr.succeed(seq)
				}
			}
			return produced, err
		}
	}
}

// consumeTransform runs a router with the transform handler from topic to
// its output topic until ctx ends; then it closes the router.
func consumeTransform(ctx context.Context, setup transformSetup, topic string, tr *tracker) error {
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("creating the router: %w", err)
	}
	router.AddHandler("bench", topic, setup.sub, outputTopic(topic), bookingPublisher{setup.pub, tr},
		func(msg *message.Message) ([]*message.Message, error) {
			if _, _, ok := deliver(tr, msg.Payload); !ok {
				return nil, nil // not a corpus message: counted as invalid, fails the run
			}
			return []*message.Message{transformOutput(msg)}, nil
		}).AddMiddleware(append([]message.HandlerMiddleware{bookCommitted(tr)}, setup.middleware...)...)
	return runUntilDone(ctx, router)
}

// checkOutputs compares the entries of topic's output topic with the n
// messages consumed: fewer is an error, more are duplicates.
func (b *bench) checkOutputs(ctx context.Context, topic string, n int) (int64, error) {
	got, err := b.admin.XLen(ctx, outputTopic(topic)).Result()
	if err != nil {
		return 0, fmt.Errorf("counting the outputs in %s: %w", outputTopic(topic), err)
	}
	if got < int64(n) {
		return 0, fmt.Errorf("%s holds %d outputs of %d messages", outputTopic(topic), got, n)
	}
	return got - int64(n), nil
}

// allocCounter reads the process' allocations so far: heap objects and bytes.
func allocCounter() (objects, bytes uint64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs, ms.TotalAlloc
}

// costRows returns the rows of a cost table: for every scenario scn picks,
// each side's median rate, its range and allocations per message, and for
// each side compared picks, its rate over the plain valkeystream side's,
// with the spread of the paired runs of each repetition.
func (r report) costRows(scn func(scenario) bool, compared func(side string) bool) []string {
	var rows []string
	for _, sc := range r.scenarios {
		if !scn(sc) {
			continue
		}
		for _, size := range r.cfg.allSizes() {
			for _, delay := range r.cfg.delays {
				plainKey := key{sc.id, sideValkeystream, size, delay}
				plain, plainOK := r.res.medianRate(plainKey)
				for _, name := range sc.sides {
					k := key{sc.id, name, size, delay}
					rate, ok := r.res.medianRate(k)
					if !ok {
						continue
					}
					cost, paired := "–", "–"
					if compared(name) && plainOK {
						cost = "**" + formatRatio(ratio(rate, plain)) + "**"
						without, with := r.res.samples[plainKey], r.res.samples[k]
						ps := make([]float64, min(len(without), len(with)))
						for i := range ps {
							ps[i] = ratio(with[i].rate(), without[i].rate())
						}
						if len(ps) > 0 {
							paired = formatRatio(slices.Min(ps)) + " to " + formatRatio(slices.Max(ps))
						}
					}
					lo, hi := r.res.rateRange(k)
					objects, bytes := r.res.allocsPerMessage(k)
					rows = append(rows, fmt.Sprintf("| %d B | %s | %s | %s | %s to %s | %.0f | %s | %s | %s |",
						size, r.rttCell(delay), name, formatRate(rate), formatRate(lo), formatRate(hi),
						objects, formatBytes(int64(bytes)), cost, paired))
				}
			}
		}
	}
	return rows
}

// writeExactlyOnceCost reports, for the transform scenario, each side's
// rate and allocations per message, and exactly-once's rate over the plain
// valkeystream side's at each distance, from the medians, with the spread
// of the paired runs of each repetition.
func (r report) writeExactlyOnceCost(w *strings.Builder) {
	rows := r.costRows(func(scn scenario) bool { return scn.transform }, func(name string) bool {
		return name == sideExactlyOnce || name == sideExactlyOnceState
	})
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Cost of exactly-once outputs\n\nA router handler on the Subscriber returns one output per input, to an\n"+
		"output topic through the side's Publisher: the plain at-least-once path\n"+
		"(the router publishes the output, then Acks the input), and `%s`,\n"+
		"the same handler under `ExactlyOnce` (the output and the input's `XACK`\n"+
		"in one script, one round trip per input). A message counts once its\n"+
		"output is written. Allocations are the whole process' during the timed\n"+
		"part (the consumer, the router and the benchmark's books), per message,\n"+
		"median over the runs. The ratio is exactly-once's rate over the plain\n"+
		"rate (1.00: no cost); the paired ratios divide the runs of each\n"+
		"repetition, which ran one after the other, and show the noise.\n\n", sideExactlyOnce)
	w.WriteString("| payload | round trip | side | msg/s | runs | allocs/msg | bytes/msg | exactly-once / plain | paired ratios |\n")
	w.WriteString("|---:|---:|---|---:|---|---:|---:|---:|---|\n")
	w.WriteString(strings.Join(rows, "\n") + "\n\n")
}
