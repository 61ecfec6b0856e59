package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/combine"
	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/serverinfo"
)

// Publisher appends messages to streams with XADD. It implements
// message.Publisher and is safe for concurrent use.
type Publisher struct {
	config PublisherConfig
	logger watermill.LoggerAdapter

	combiners combiners
	stats     *publisherCounters
	failover  failover.Hints
	verbs     publishVerbs // the server's newer verbs, found out on first use

	idempotency idempotency
	partitions  *partitionedTopics // see partitioned.go

	mu     sync.RWMutex // Publish holds it shared, Close exclusively
	closed bool
}

// NewPublisher returns a Publisher, or an error wrapping ErrInvalidConfig that
// names the bad field. A nil logger logs nothing.
func NewPublisher(config PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	config.Retention = maps.Clone(config.Retention)
	partitions, err := newPartitionedTopics(config.Partitions, config.KeyPrefix, "Partitions")
	if err != nil {
		return nil, err
	}
	stats := &publisherCounters{}
	wait := combine.ReplicaWait{Replicas: config.WaitReplicas, Timeout: config.WaitTimeout}
	return &Publisher{config: config, logger: logger, stats: stats,
		combiners:   newCombiners(config.Client, wait, stats),
		verbs:       publishVerbs{known: serverinfo.NewKnown(config.Client, config.BaselineVerbs)},
		idempotency: idempotency{window: config.IdempotentWindow},
		partitions:  partitions}, nil
}

// Publish appends msgs to the stream of topic, in order, in one round trip.
// Calls made at the same time for the same topic share round trips: up to
// eight are in flight at once for a topic, and a call that finds eight in
// progress waits, then goes with the others that queued meanwhile (up to
// 1000 messages). Publish returns after the server accepted the call's own
// messages. If some were not written, the error is a
// *PublishError that lists their UUIDs; the others were written. A message
// that cannot be encoded fails the whole call before anything is sent. When
// a message's context ends before the messages are sent, the call returns at
// once with nothing written. Once they are sent it waits for the answer: a
// round trip of its own ends with its context, one shared with other calls
// at the latest of their deadlines or else by the client's timeouts.
//
// A message whose Watermill delay metadata (components/delay) says it is due
// later is held back until then; a call that carries one is written in one
// atomic step, all or nothing (see docs/delay.md).
//
// Without PublisherConfig.IdempotentWindow, an XADD is never sent twice by
// the client (go-redis' retries are off for it), so one call stores each
// message once at most. A connection lost after the messages were sent
// hides whether they were written: those are listed in
// PublishError.MaybeWritten (errors.Is(err, ErrMaybeWritten)); publishing
// them again may store duplicates, which consumers drop by UUID. With
// IdempotentWindow, the client may send an XADD again, and publishing a
// message again within the window stores nothing new: publishing the
// MaybeWritten ones again is safe.
//
// With PublisherConfig.WaitReplicas, Publish also waits until that many
// replicas have the messages; an error wrapping [ErrNotReplicated] means
// they were written on the master but not confirmed by enough replicas.
// After a connection error on a cluster client, Publish makes the client
// reload its slot map, so that calls find a newly promoted master promptly.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) (err error) {
	if st, err := stepOf(msgs); st != nil || err != nil {
		if err != nil {
			return err
		}
		if topic == "" {
			return errors.New("valkeystream: publish: topic is empty")
		}
		return st.publish(p, topic, msgs) // see step.go: written when the handling commits
	}
	defer func() { p.stats.published(len(msgs), err) }()
	if topic == "" {
		return errors.New("valkeystream: publish: topic is empty")
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrPublisherClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	if l := p.partitions.layout(topic); l != nil {
		return p.publishPartitioned(topic, l, msgs) // see partitioned.go
	}
	key := p.config.KeyPrefix + topic
	if !p.partitions.knownPlain(topic) { // the first Publish of topic only
		ctx, cancel := publishContext(msgs)
		l, err := p.partitions.resolve(ctx, p.config.Client, topic, key)
		cancel()
		if err != nil {
			return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
		}
		if l != nil { // partitioned on the server: from now on like one of Partitions
			return p.publishPartitioned(topic, l, msgs) // see partitioned.go
		}
	}
	return p.publishTo(topic, key, msgs)
}

// publishTo writes msgs of topic to the stream key. The caller holds mu.
func (p *Publisher) publishTo(topic, key string, msgs []*message.Message) error {
	if plan := planDelays(msgs, time.Now()); plan.any() {
		return p.publishDelayed(topic, key, msgs, plan) // see delay.go
	}
	ctx, cancel := publishContext(msgs)
	defer cancel()
	req := combine.NewRequest(len(msgs))
	args := req.Args
	trim, verbs, err := p.trimmingOf(ctx, topic)
	if err != nil {
		p.failover.Failed(p.config.Client, err)
		return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
	}
	idempotent := p.config.IdempotentWindow > 0
	idmp := idempotent && verbs.IdempotentAdd
	if idmp {
		if err := p.idempotency.configure(ctx, p.config.Client, key); err != nil {
			p.failed(err)
			return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
		}
	}
	for i, msg := range msgs {
		fields, err := p.config.Marshaler.Marshal(topic, msg)
		if err != nil {
			return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs),
				Err: fmt.Errorf("encoding message %s: %w", msg.UUID, err)}
		}
		args[i] = redis.XAddArgs{Stream: key, Values: fields}
		trim.apply(&args[i])
		switch {
		case !idempotent || msg.UUID == "":
		case idmp:
			args[i].ProducerID, args[i].IdempotentID = idempotentProducer(msg.UUID), msg.UUID
		default:
			mark, err := idempotencyMarkKey(key, msg.UUID)
			if err != nil {
				return &PublishError{Topic: topic, NotSent: uuids(msgs), Total: len(msgs), Err: err}
			}
			if req.Marks == nil {
				req.Marks = make([]string, len(msgs))
				req.MarkTTL = p.config.IdempotentWindow.Milliseconds()
			}
			req.Marks[i] = mark
		}
	}

	p.combiners.streams.Write(ctx, key, req)

	var failed, maybe []string
	var first error
	for i, err := range req.Errs {
		if err == nil {
			continue
		}
		if mayHaveWritten(err) {
			maybe = append(maybe, msgs[i].UUID)
		} else {
			failed = append(failed, msgs[i].UUID)
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		first = notReplicated(first)
		p.failed(first)
		return &PublishError{Topic: topic, NotSent: failed, MaybeWritten: maybe, Total: len(msgs), Err: first}
	}
	// No per-call log line: a Watermill logger cannot say whether it would
	// drop a line, so the fields alone would cost an allocation per call.
	return nil
}

// trimming is how the XADDs of one call trim their stream.
type trimming struct {
	on     bool
	maxLen int64
	minID  string
	mode   string // "ACKED" or ""
}

// trimmingOf returns how XADDs to topic trim its stream now, and the
// server's verbs when the call needs them (see verbsNeeded).
func (p *Publisher) trimmingOf(ctx context.Context, topic string) (trimming, serverinfo.Verbs, error) {
	var t trimming
	retention, trim := p.config.Retention[topic]
	if trim && retention.MaxAge > 0 {
		if oldest := time.Now().Add(-retention.MaxAge).UnixMilli(); oldest > 0 {
			t.minID = strconv.FormatInt(oldest, 10)
		} else {
			trim = false // no entry is that old
		}
	}
	var verbs serverinfo.Verbs
	if p.verbsNeeded(trim, retention) {
		var err error
		if verbs, err = p.serverVerbs(ctx); err != nil {
			return t, verbs, err
		}
	}
	if trim {
		t.on, t.maxLen = true, retention.MaxLen
		t.mode = p.trimMode(topic, retention, verbs)
	}
	return t, verbs, nil
}

// apply sets the trimming of a.
func (t trimming) apply(a *redis.XAddArgs) {
	if t.on {
		a.MaxLen, a.MinID, a.Approx, a.Mode = t.maxLen, t.minID, true, t.mode
	}
}

// by returns the trimming's strategy and threshold: "MAXLEN" and the
// length, "MINID" and the id, or two empty strings for none.
func (t trimming) by() (strategy, threshold string) {
	switch {
	case !t.on:
	case t.maxLen > 0:
		return "MAXLEN", strconv.FormatInt(t.maxLen, 10)
	case t.minID != "":
		return "MINID", t.minID
	}
	return "", ""
}

// words returns the XADD arguments of the trimming, between the key and
// the id (for scripts, which build their XADDs themselves): the mode, the
// strategy, "~" and the threshold.
func (t trimming) words() []any {
	strategy, threshold := t.by()
	if strategy == "" {
		return nil
	}
	if t.mode != "" {
		return []any{t.mode, strategy, "~", threshold}
	}
	return []any{strategy, "~", threshold}
}

// failed is told the error of a failed call: after one that a failover
// causes, the Publisher helps the client find the new master and finds out
// the server's verbs again.
func (p *Publisher) failed(err error) {
	if failover.Symptom(err) || serverinfo.RefusedVerb(err) {
		p.forgetServer()
	}
	p.failover.Failed(p.config.Client, err)
}

// Close makes later Publish calls fail with ErrPublisherClosed, after the
// calls in progress have returned. It closes the client only if CloseClient
// is set. It may be called more than once.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.config.CloseClient {
		if err := p.config.Client.Close(); err != nil {
			return fmt.Errorf("valkeystream: closing the publisher's client: %w", err)
		}
	}
	return nil
}

// publishContext returns a context that ends when the context of any of msgs
// ends. Messages without a context of their own add no cost.
func publishContext(msgs []*message.Message) (context.Context, context.CancelFunc) {
	var only context.Context
	var many []context.Context
	for _, m := range msgs {
		c := m.Context()
		if c.Done() == nil || c == only {
			continue
		}
		if only == nil {
			only = c
			continue
		}
		many = append(many, c)
	}
	if only == nil {
		return context.Background(), func() {}
	}
	if len(many) == 0 {
		return only, func() {}
	}
	ctx, cancel := context.WithCancel(only)
	stops := make([]func() bool, 0, len(many))
	for _, c := range many {
		stops = append(stops, context.AfterFunc(c, cancel))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

func uuids(msgs []*message.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	return ids
}

// mayHaveWritten reports whether a message whose XADD failed with err may
// be in the stream all the same: it was sent, and no answer of the server
// came back. A server's reply, a connection never made, a closed client
// and a call never sent mean it was not written; a reply of too few
// replicas means it was.
func mayHaveWritten(err error) bool {
	var reply redis.Error
	var op *net.OpError
	switch {
	case errors.Is(err, combine.ErrUnsent), errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout):
		return false
	case errors.As(err, &reply):
		return false
	case errors.As(err, &op) && op.Op == "dial":
		return false
	}
	var short *combine.NotReplicatedError
	return !errors.As(err, &short)
}
