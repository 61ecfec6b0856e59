package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// The go-redis reference: what the server and the client library reach
// without an adapter. It writes the entries valkeystream writes (uuid,
// payload, then each metadata key), so the server does the same work.

// rawPublisher sends one XADD per call for one message, and pipelines the
// XADDs of a call with several.
type rawPublisher struct {
	client redis.UniversalClient
}

func rawFields(msg *message.Message) []any {
	fields := make([]any, 0, 4+2*len(msg.Metadata))
	fields = append(fields, "uuid", msg.UUID, "payload", []byte(msg.Payload))
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fields = append(fields, k, msg.Metadata[k])
	}
	return fields
}

func (p rawPublisher) Publish(topic string, msgs ...*message.Message) error {
	ctx := context.Background()
	if len(msgs) == 1 {
		return p.client.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: rawFields(msgs[0])}).Err()
	}
	pipe := p.client.Pipeline()
	for _, msg := range msgs {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: rawFields(msg)})
	}
	_, err := pipe.Exec(ctx)
	return err
}

func (rawPublisher) Close() error { return nil }

// prefillRaw writes the corpus with pipelined XADDs and creates the group at
// the head of the stream.
func prefillRaw(ctx context.Context, sc *scope, topic string, c corpus) error {
	pub := rawPublisher{sc.client()}
	if err := publishCorpus(ctx, pub, topic, c); err != nil {
		return err
	}
	if err := pub.client.XGroupCreate(ctx, topic, group, "0").Err(); err != nil {
		return fmt.Errorf("creating group %s on %s: %w", group, topic, err)
	}
	return nil
}

// consumeRaw reads new entries 100 at a time with XREADGROUP and
// acknowledges each batch with one XACK, until the tracker is done.
func consumeRaw(ctx context.Context, sc *scope, topic string, tr *tracker) error {
	client := sc.client()
	ids := make([]string, 0, 100)
	seqs := make([]int, 0, 100)
	for {
		select {
		case <-tr.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		streams, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group:    group,
			Consumer: "raw",
			Streams:  []string{topic, ">"},
			Count:    100,
			Block:    100 * time.Millisecond,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return fmt.Errorf("XREADGROUP on %s: %w", topic, err)
		}
		ids, seqs = ids[:0], seqs[:0]
		for _, s := range streams {
			for _, m := range s.Messages {
				payload, _ := m.Values["payload"].(string)
				if seq, _, ok := deliver(tr, payload); ok {
					seqs = append(seqs, seq)
				}
				ids = append(ids, m.ID)
			}
		}
		if len(ids) == 0 {
			continue
		}
		if err := client.XAck(ctx, topic, group, ids...).Err(); err != nil {
			return fmt.Errorf("XACK on %s: %w", topic, err)
		}
		for _, seq := range seqs {
			tr.succeed(seq)
		}
	}
}
