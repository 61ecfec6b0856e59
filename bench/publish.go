package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// runPublish times publishing the corpus to a new topic with the side's
// publisher, then checks that the stream holds every message.
func (b *bench) runPublish(ctx context.Context, scn scenario, sd side, c corpus) (sample, error) {
	sc := newScope(b.dist.addr)
	defer sc.close()
	pub, err := sd.publisher(sc)
	if err != nil {
		return sample{}, err
	}
	topic := b.topic(scn, sd, c)
	defer b.cleanup(ctx, topic)

	msgs := c.messages(0, c.n) // made before the clock starts
	if err := sc.warm(ctx, scn.goroutines); err != nil {
		return sample{}, err
	}
	start := time.Now()
	if err := publishAll(ctx, pub, topic, msgs, scn.goroutines, scn.perCall); err != nil {
		return sample{}, err
	}
	elapsed := time.Since(start)

	stored, err := b.admin.XLen(ctx, topic).Result()
	if err != nil {
		return sample{}, fmt.Errorf("counting the entries of %s: %w", topic, err)
	}
	if stored != int64(c.n) {
		return sample{}, fmt.Errorf("%s published %d messages without error, but %s holds %d entries", sd.name, c.n, topic, stored)
	}
	if err := sc.close(); err != nil {
		return sample{}, err
	}
	return sample{n: c.n, elapsed: elapsed}, nil
}

// publishAll publishes msgs in calls of perCall messages from the given
// number of goroutines, which take the next call as they finish one. It
// returns the first error, after every goroutine has stopped.
func publishAll(ctx context.Context, pub message.Publisher, topic string, msgs []*message.Message, goroutines, perCall int) error {
	calls := (len(msgs) + perCall - 1) / perCall
	var next atomic.Int64
	var failed atomic.Bool
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for !failed.Load() && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= calls {
					return
				}
				batch := msgs[i*perCall : min((i+1)*perCall, len(msgs))]
				if err := pub.Publish(topic, batch...); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("publishing to %s: %w", topic, err) })
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
