package loop

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// FanOut is one subscription without a consumer group: it reads every entry
// with XREAD from where it started. Nothing is pending on the server, so Ack
// only moves on, and a Nacked message is delivered again from memory.
type FanOut struct {
	cfg     Config // Stream, BatchSize, BlockTime and NackDelay
	deps    Deps   // Counters, Logger, Health, Decode and Delivered
	read    ReadFunc
	out     chan *message.Message
	lastID  string // the last entry read
	queue   []Entry
	retries retries
}

// ReadFunc reads up to count entries after the id from, waiting up to block
// for the first.
type ReadFunc func(ctx context.Context, from string, count int64, block time.Duration) ([]Entry, error)

// NewFanOut returns the loop of a fan-out subscription that reads with read
// from after the id start, and sends its messages to out, which Run closes
// when it ends.
func NewFanOut(cfg Config, deps Deps, read ReadFunc, start string, out chan *message.Message) *FanOut {
	return &FanOut{cfg: cfg, deps: deps, read: read, out: out, lastID: start,
		retries: retries{faults: deps.Counters, logger: deps.Logger, health: deps.Health}}
}

// RedisRead is the ReadFunc of stream key on client: XREAD.
func RedisRead(client redis.UniversalClient, key string) ReadFunc {
	return func(ctx context.Context, from string, count int64, block time.Duration) ([]Entry, error) {
		streams, err := client.XRead(ctx, &redis.XReadArgs{Streams: []string{key, from}, Count: count, Block: block}).Result()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		var es []Entry
		for _, st := range streams {
			es = appendEntries(es, st.Messages)
		}
		return es, err
	}
}

// Run delivers until ctx ends, then closes the channel.
func (l *FanOut) Run(ctx context.Context) {
	defer close(l.out)
	counters := l.deps.Counters
	defer func() { counters.ReadAhead.Add(-int64(len(l.queue))) }()
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
		counters.ReadAhead.Add(-1)
		counters.InFlight.Add(1)
		ok := l.handle(ctx, m)
		counters.InFlight.Add(-1)
		if !ok {
			return
		}
	}
}

// handle delivers m until it is Acked, again from memory after each Nack. It
// returns false when the subscription ended.
func (l *FanOut) handle(ctx context.Context, m Entry) bool {
	counters := l.deps.Counters
	for count := 1; ; count++ {
		msg, err := l.deps.Handling.Decode(m)
		if err != nil {
			// A fan-out reader owns nothing it could move or acknowledge:
			// the entry stays in the stream, for a person to look at.
			counters.InvalidEntries.Add(1)
			l.deps.Logger.Error("Entry cannot be decoded; skipped (it stays in the stream)", err,
				watermill.LogFields{"entry_id": m.ID})
			return true
		}
		msg.Metadata.Set(MetadataDeliveryCount, strconv.Itoa(count))
		clearVerdict(msg)
		msgCtx, cancel := context.WithCancel(ctx)
		msg.SetContext(msgCtx)
		if l.deps.Handling.Delivered != nil {
			l.deps.Handling.Delivered(m.ID)
		}
		result := l.deliver(ctx, msg)
		cancel()
		switch result {
		case acked:
			return true
		case stopped, ackedThenStopped:
			return false
		}
		counters.Nacked.Add(1)
		if v := verdictOf(msg); v.giveUp {
			// Nothing to dead-letter from or acknowledge: like an
			// undecodable entry, it stays in the stream.
			counters.Nacks.GivenUp.Add(1)
			l.deps.Logger.Error("Message given up by its handler; skipped (it stays in the stream)", nil,
				watermill.LogFields{"entry_id": m.ID, "message_uuid": msg.UUID, "reason": v.reason})
			return true
		}
		delay := l.cfg.NackDelay(int64(count))
		counters.nackWaited(delay)
		if !sleep(ctx, delay) {
			return false
		}
	}
}

// deliver hands msg to the handler and waits until it is Acked or Nacked.
func (l *FanOut) deliver(ctx context.Context, msg *message.Message) outcome {
	w := waits{out: l.out, msg: msg}
	for {
		switch w.next(ctx) {
		case evSent:
			l.deps.Counters.Delivered.Add(1)
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

func (l *FanOut) fetch(ctx context.Context) error {
	es, err := l.read(ctx, l.lastID, l.cfg.BatchSize, l.cfg.BlockTime)
	if err != nil {
		return err
	}
	l.queue = append(l.queue, es...)
	l.deps.Counters.ReadAhead.Add(int64(len(es)))
	if len(l.queue) > 0 {
		l.lastID = l.queue[len(l.queue)-1].ID
	}
	return nil
}
