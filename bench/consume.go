package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// errNack is what the router handler returns to Nack a message.
var errNack = errors.New("nacked by the benchmark")

// pendingWait bounds how long a run waits, after the last message succeeded,
// for the side's last Acks to reach the server.
const pendingWait = 3 * time.Second

// runConsume pre-fills a new topic with the corpus (not timed), then times
// the side reading all of it, and checks that every message succeeded and
// that nothing is left pending.
func (b *bench) runConsume(ctx context.Context, scn scenario, sd side, c corpus) (sample, error) {
	sc := newScope(b.dist.addr)
	defer sc.close()
	topic := b.topic(scn, sd, c)
	defer b.cleanup(ctx, topic)
	if sd.partitions > 0 {
		defer b.cleanupStreams(ctx, sd.streamsOf(topic))
	}
	tr := newTracker(c, scn.nack)

	var consume func(ctx context.Context) error
	switch {
	case scn.transform:
		defer b.cleanup(ctx, outputTopic(topic))
		if sd.transform == nil {
			return sample{}, fmt.Errorf("%s has no transform", sd.name)
		}
		if err := sd.fill(ctx, sc, topic, c); err != nil {
			return sample{}, err
		}
		setup, err := sd.transform(sc)
		if err != nil {
			return sample{}, err
		}
		consume = func(ctx context.Context) error { return consumeTransform(ctx, setup, topic, tr) }
	case sd.rawConsume != nil:
		if err := sd.rawPrefill(ctx, sc, topic, c); err != nil {
			return sample{}, err
		}
		consume = func(ctx context.Context) error { return sd.rawConsume(ctx, sc, topic, tr) }
	default:
		sub, err := sd.prefill(ctx, sc, topic, c)
		if err != nil {
			return sample{}, err
		}
		consume = func(ctx context.Context) error {
			if scn.router {
				return consumeRouter(ctx, sub, topic, tr, scn.nack)
			}
			return consumeChannel(ctx, sub, topic, tr, scn.nack)
		}
	}

	if err := sc.warm(ctx, 2); err != nil {
		return sample{}, err
	}
	var pending, extra int64 // extra: outputs beyond one per message (transform)
	settled := func() error {
		if sd.inMemory {
			return nil
		}
		var err error
		pending, err = b.pendingAfter(ctx, sd.streamsOf(topic)...)
		if pending > 0 {
			b.describePending(ctx, sd.streamsOf(topic)...)
		}
		if err == nil && scn.transform {
			extra, err = b.checkOutputs(ctx, topic, c.n)
		}
		return err
	}
	alloc, err := b.timeConsume(ctx, tr, consume, settled)
	if err != nil {
		return sample{}, fmt.Errorf("%s on %s: %w", sd.name, topic, err)
	}
	s := sample{
		n:          c.n,
		elapsed:    tr.elapsed(),
		duplicates: tr.duplicates.Load() + extra,
		pending:    pending,
		nacks:      tr.nacked.Load(),
		deliveries: tr.delivered.Load(),
		tail:       tr.tail(),
		allocs:     alloc.objects,
		allocBytes: alloc.bytes,
	}
	s.redeliveryMean, s.redeliveryMax = tr.redeliveryWait()
	if err := sc.close(); err != nil {
		return sample{}, err
	}
	return s, nil
}

// timeConsume starts the clock and runs consume until every message of tr
// succeeded, and returns what the process allocated until then. Then, with consume still running, it calls settled (if not
// nil), which checks that the side's last Acks reached the server; then it
// stops consume and waits for it. An error of consume ends the run at once.
func (b *bench) timeConsume(ctx context.Context, tr *tracker, consume func(context.Context) error, settled func() error) (allocCount, error) {
	var alloc allocCount
	waitCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	objects, bytes := allocCounter()
	tr.begin()
	go func() {
		err := consume(runCtx)
		if err != nil {
			fail(err)
		}
		done <- err
	}()
	err := tr.wait(waitCtx, b.cfg.stall)
	if err == nil {
		endObjects, endBytes := allocCounter()
		alloc = allocCount{objects: endObjects - objects, bytes: endBytes - bytes}
	}
	if err == nil && settled != nil {
		err = settled()
	}
	stop()
	if consumeErr := <-done; err == nil {
		err = consumeErr
	}
	return alloc, err
}

// consumeChannel reads from the Subscribe channel and settles each message
// itself, until ctx ends.
func consumeChannel(ctx context.Context, sub message.Subscriber, topic string, tr *tracker, nack bool) error {
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return fmt.Errorf("subscribing: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-msgs:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("the subscriber closed its channel before every message arrived")
			}
			if handle(tr, msg, nack) {
				msg.Ack()
			} else {
				msg.Nack()
			}
		}
	}
}

// consumeRouter runs a router whose handler settles each message by its
// return value, until ctx ends; then it closes the router.
func consumeRouter(ctx context.Context, sub message.Subscriber, topic string, tr *tracker, nack bool) error {
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("creating the router: %w", err)
	}
	router.AddConsumerHandler("bench", topic, sub, func(msg *message.Message) error {
		if handle(tr, msg, nack) {
			return nil
		}
		return errNack
	})
	return runUntilDone(ctx, router)
}

// runUntilDone runs router until ctx ends (the run's last message succeeded),
// then closes it; a router that stops before is an error.
func runUntilDone(ctx context.Context, router *message.Router) error {
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	select {
	case <-ctx.Done():
	case err := <-ran:
		if err == nil {
			err = errors.New("the router stopped before every message arrived")
		}
		return fmt.Errorf("running the router: %w", err)
	}
	closeErr := router.Close()
	runErr := <-ran
	if err := errors.Join(closeErr, runErr); err != nil {
		return fmt.Errorf("closing the router: %w", err)
	}
	return nil
}

// handle books a delivery and returns whether to Ack it (true) or Nack it.
// In the nack scenario the first delivery of one message in nackOneIn is
// Nacked.
func handle(tr *tracker, msg *message.Message, nack bool) bool {
	seq, first, ok := deliver(tr, msg.Payload)
	if !ok {
		return true // not a corpus message: counted as invalid, fails the run
	}
	if nack && first && nackFirst(msg.UUID) {
		tr.nack(seq)
		return false
	}
	tr.succeed(seq)
	return true
}

// describePending writes the first entries left pending on the streams
// (a topic's, or its partitions') to the progress output, for a look at
// what a side left behind.
func (b *bench) describePending(ctx context.Context, streams ...string) {
	for _, topic := range streams {
		left, err := b.admin.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: group, Start: "-", End: "+", Count: 5}).Result()
		if err != nil {
			fmt.Fprintf(b.progress, "warning: listing the pending entries of %s: %v\n", topic, err)
			return
		}
		for _, p := range left {
			fmt.Fprintf(b.progress, "left pending on %s: entry %s, consumer %s, idle %s, delivered %d times\n",
				topic, p.ID, p.Consumer, p.Idle.Round(time.Millisecond), p.RetryCount)
		}
	}
}

// pendingAfter waits up to pendingWait for the group's pending lists on the
// streams (a topic's, or its partitions') to empty, and returns what is
// left in them.
func (b *bench) pendingAfter(ctx context.Context, streams ...string) (int64, error) {
	deadline := time.Now().Add(pendingWait)
	for {
		var count int64
		for _, topic := range streams {
			p, err := b.admin.XPending(ctx, topic, group).Result()
			if err != nil {
				return 0, fmt.Errorf("reading the pending entries of %s: %w", topic, err)
			}
			count += p.Count
		}
		if count == 0 || time.Now().After(deadline) {
			return count, nil
		}
		select {
		case <-ctx.Done():
			return count, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
