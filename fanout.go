package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// fanOutLoop is one subscription without a consumer group: it reads every
// entry with XREAD from where it started. Nothing is pending on the server,
// so Ack only moves on, and a Nacked message is delivered again from memory.
type fanOutLoop struct {
	sub    *Subscriber
	key    string
	out    chan *message.Message
	lastID string // the last entry read
	logger watermill.LoggerAdapter

	queue   []redis.XMessage
	retries retries
}

func (l *fanOutLoop) run(ctx context.Context) {
	defer close(l.out)
	defer func() { l.sub.stats.readAhead.Add(-int64(len(l.queue))) }()
	for ctx.Err() == nil {
		if len(l.queue) == 0 {
			if err := l.fetch(ctx); err != nil {
				if ctx.Err() != nil || !l.retries.fail(ctx, "reading entries", err, sleep) {
					return
				}
				continue
			}
			l.retries.succeeded()
			continue
		}
		m := l.queue[0]
		l.queue = l.queue[1:]
		l.sub.stats.readAhead.Add(-1)
		l.sub.stats.inFlight.Add(1)
		ok := l.handle(ctx, m)
		l.sub.stats.inFlight.Add(-1)
		if !ok {
			return
		}
	}
}

// handle delivers m until it is Acked, again from memory after each Nack. It
// returns false when the subscription ended.
func (l *fanOutLoop) handle(ctx context.Context, m redis.XMessage) bool {
	cfg := &l.sub.config
	for count := 1; ; count++ {
		msg, err := decodeEntry(cfg.Unmarshaler, m.Values, origin{stream: l.key, entryID: m.ID})
		if err != nil {
			// A fan-out reader owns nothing it could move or acknowledge:
			// the entry stays in the stream, for a person to look at.
			l.sub.stats.invalidEntries.Add(1)
			l.logger.Error("Entry cannot be decoded; skipped (it stays in the stream)", err,
				watermill.LogFields{"entry_id": m.ID})
			return true
		}
		msg.Metadata.Set(MetadataDeliveryCount, strconv.Itoa(count))
		msgCtx, cancel := context.WithCancel(ctx)
		msg.SetContext(msgCtx)
		l.sub.observe.delivered(l.key, "", m.ID)
		result := l.deliver(ctx, msg)
		cancel()
		switch result {
		case acked:
			return true
		case stopped, ackedThenStopped:
			return false
		}
		l.sub.stats.nacked.Add(1)
		delay := nackDelay(cfg, int64(count))
		l.sub.stats.nackWaited(delay)
		if !sleep(ctx, delay) {
			return false
		}
	}
}

// deliver hands msg to the handler and waits until it is Acked or Nacked.
func (l *fanOutLoop) deliver(ctx context.Context, msg *message.Message) outcome {
	w := waits{out: l.out, msg: msg}
	for {
		switch w.next(ctx) {
		case evSent:
			l.sub.stats.delivered.Add(1)
			w.sent()
		case evAcked:
			return acked
		case evNacked:
			return nacked
		default:
			return w.stopped()
		}
	}
}

func (l *fanOutLoop) fetch(ctx context.Context) error {
	cfg := &l.sub.config
	streams, err := cfg.Client.XRead(ctx, &redis.XReadArgs{
		Streams: []string{l.key, l.lastID},
		Count:   cfg.BatchSize,
		Block:   cfg.BlockTime,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading entries: %w", err)
	}
	for _, s := range streams {
		l.queue = append(l.queue, s.Messages...)
		l.sub.stats.readAhead.Add(int64(len(s.Messages)))
	}
	if len(l.queue) > 0 {
		l.lastID = l.queue[len(l.queue)-1].ID
	}
	return nil
}

// fanOutStart resolves where a fan-out subscription begins. StartNew is turned
// into the id of the last entry now, so that nothing added after Subscribe
// returns is missed.
func (s *Subscriber) fanOutStart(ctx context.Context, key string) (string, error) {
	if s.config.Start == StartHead {
		return "0-0", nil
	}
	last, err := s.config.Client.XRevRangeN(ctx, key, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("valkeystream: reading the last entry of stream %q to start a fan-out subscription: %w", key, err)
	}
	if len(last) == 0 {
		return "0-0", nil
	}
	return last[0].ID, nil
}
