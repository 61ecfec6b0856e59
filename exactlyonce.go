package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/loop"
)

// Exactly-once outputs: a handler's published messages and its input's
// acknowledgement in one atomic step on the server (see docs/reliability.md,
// "Exactly-once outputs"). The step is one script: it checks that the
// input entry is still pending for this consumer with this delivery's
// count (the fencing), appends the outputs, writes a Deduplicator's done
// mark and acknowledges the input. Either all of it happens or none.

// DefaultExactlyOnceCommitTimeout is how long a step's commit is tried
// before the handling fails (and its message is Nacked).
const DefaultExactlyOnceCommitTimeout = 5 * time.Second

// ExactlyOnceConfig configures [ExactlyOnce]. [NewExactlyOnce] takes a copy.
type ExactlyOnceConfig struct {
	// Publisher writes the messages a router handler returns, inside the
	// step, to the handler's publish topic, as its Publish would (its
	// KeyPrefix, Marshaler, Retention and WaitReplicas). Messages the
	// handler publishes itself through any valkeystream Publisher, with
	// the input message's context (as Watermill's CQRS event bus does),
	// join the step too. Every such Publisher must use the Subscriber's
	// client (the same redis.UniversalClient value): the step runs on it.
	// Required.
	Publisher *Publisher

	// NonAtomicFallback makes a step whose keys cannot be written in one
	// step (on a cluster, keys in more than one hash slot) publish its
	// outputs and acknowledge its input the usual way, one after the
	// other, counted in [ExactlyOnceStats].NonAtomic: a crash between the
	// two publishes the outputs again. Default: false, such a handling
	// fails with an error wrapping [ErrNotAtomic], before its handler runs
	// when the router's publish topic is the reason.
	NonAtomicFallback bool

	// CommitTimeout is how long a step's commit is tried, again after a
	// connection error (the step is safe to send again: a second one that
	// finds the input acknowledged writes nothing), before the handling
	// fails and its message is Nacked. Default:
	// DefaultExactlyOnceCommitTimeout.
	CommitTimeout time.Duration
}

func (c *ExactlyOnceConfig) setDefaults() {
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultExactlyOnceCommitTimeout
	}
}

// Validate reports the first invalid field, in an error wrapping
// ErrInvalidConfig.
func (c ExactlyOnceConfig) Validate() error {
	switch {
	case c.Publisher == nil:
		return fmt.Errorf("%w: ExactlyOnceConfig.Publisher is required: pass the valkeystream Publisher of the handlers' outputs", ErrInvalidConfig)
	case c.CommitTimeout < 0:
		return fmt.Errorf("%w: ExactlyOnceConfig.CommitTimeout is %s: it must be positive (0: %s)", ErrInvalidConfig, c.CommitTimeout, DefaultExactlyOnceCommitTimeout)
	}
	return nil
}

// ExactlyOnce is a router middleware that makes the outputs of a handling
// and the acknowledgement of its input one atomic step: after a crash, the
// redelivered input runs its handler again, but its outputs exist once.
// Make it with [NewExactlyOnce]; use it for the handlers of a valkeystream
// Subscriber with a consumer group.
type ExactlyOnce struct {
	config ExactlyOnceConfig
	logger watermill.LoggerAdapter
	stats  exactlyOnceCounters
}

// ExactlyOnceStats counts what the steps of an [ExactlyOnce] did.
type ExactlyOnceStats struct {
	// Committed counts steps that acknowledged their input with their
	// outputs; Outputs the messages they wrote.
	Committed, Outputs int64
	// Superseded counts steps that wrote nothing because the input was no
	// longer this delivery's: acknowledged already (by an earlier try of
	// the same step whose reply was lost, or by another consumer), or
	// delivered again (claimed by a peer after ClaimMinIdle). The
	// handling's message is settled without an XACK; the current
	// delivery writes the outputs.
	Superseded int64
	// Failed counts steps that could not be committed within
	// CommitTimeout (the message is Nacked and comes back), NonAtomic the
	// handlings that fell back to a plain publish and Ack
	// (NonAtomicFallback), and Refused those refused with ErrNotAtomic.
	Failed, NonAtomic, Refused int64
	// NotReplicated counts committed steps whose outputs fewer replicas
	// than WaitReplicas confirmed in time: they are written, and stay.
	NotReplicated int64
	// StateWrites counts the handlers' writes to their own keys ([Step])
	// that committed steps applied; StateChanged the steps that wrote
	// nothing because a key or field did not hold what the handler
	// expected ([Step.Expect]): their messages come back.
	StateWrites, StateChanged int64
}

type exactlyOnceCounters struct {
	committed, outputs, superseded, failed, nonAtomic, refused, notReplicated atomic.Int64
	stateWrites, stateChanged                                                 atomic.Int64
}

// NewExactlyOnce returns the middleware, or an error wrapping
// ErrInvalidConfig that names the bad field. A nil logger logs nothing.
func NewExactlyOnce(config ExactlyOnceConfig, logger watermill.LoggerAdapter) (*ExactlyOnce, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &ExactlyOnce{config: config, logger: logger}, nil
}

// Stats returns the counters of the steps so far.
func (x *ExactlyOnce) Stats() ExactlyOnceStats {
	s := &x.stats
	return ExactlyOnceStats{
		Committed: s.committed.Load(), Outputs: s.outputs.Load(), Superseded: s.superseded.Load(),
		Failed: s.failed.Load(), NonAtomic: s.nonAtomic.Load(), Refused: s.refused.Load(),
		NotReplicated: s.notReplicated.Load(), StateWrites: s.stateWrites.Load(), StateChanged: s.stateChanged.Load(),
	}
}

// Middleware runs h with a step in the message's context, collects what h
// publishes through valkeystream Publishers with that context and the
// messages h returns (for the router's publish topic), and commits them
// with the input's acknowledgement in one step. It returns no messages, so
// the router publishes nothing itself; its Ack afterwards sends no XACK.
//
// Add it last (innermost, next to the handler): each attempt of
// middleware.Retry then has a step of its own. A Retry (or a DeadLetter)
// inside it would gather the outputs of every attempt, the failed ones
// included, into the one step it commits. When h fails, nothing it
// published is written. When the step finds the
// input no longer this delivery's (see ExactlyOnceStats.Superseded), it
// writes nothing and the handling succeeds. A Deduplicator inside or
// outside this middleware has its done mark written in the step.
func (x *ExactlyOnce) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		st, err := x.newStep(ctx, msg)
		if err != nil {
			x.stats.refused.Add(1)
			return nil, err
		}
		msg.SetContext(context.WithValue(ctx, stepKey{}, st))
		produced, herr := h(msg)
		msg.SetContext(ctx)
		st.end()
		if herr != nil {
			st.abort()
			return produced, herr
		}
		if len(produced) > 0 {
			if err := st.addReturned(produced); err != nil {
				st.abort()
				return nil, err
			}
		}
		if m := markOf(ctx); m != nil && !isGivenUp(ctx) {
			st.marks.fromOuter = m
			if err := st.addMark(m); err != nil {
				st.abort()
				return nil, err
			}
		}
		if st.crossSlot != "" {
			return x.nonAtomic(st, msg)
		}
		if len(st.w.ops) == 0 {
			// Nothing to write with the Ack: the router's Ack sends it,
			// batched as any other.
			return nil, nil
		}
		return nil, x.commit(ctx, st, msg)
	}
}

// newStep returns the step of the delivery whose context is ctx, after
// checking that it can be one: delivered by a valkeystream consumer group,
// on the Publisher's client, and (on a cluster) with the router's publish
// topic in the input's slot.
func (x *ExactlyOnce) newStep(ctx context.Context, msg *message.Message) (*step, error) {
	d := loop.DeliveryOf(ctx)
	src, _ := ctx.Value(stepSourceKey{}).(*stepSource)
	switch {
	case d == nil || src == nil:
		return nil, fmt.Errorf("%w: message %s was not delivered by a valkeystream Subscriber with a consumer group: ExactlyOnce acknowledges the input in the step, which needs one",
			ErrNotAtomic, msg.UUID)
	case src.client != x.config.Publisher.config.Client:
		return nil, fmt.Errorf("%w: the ExactlyOnce Publisher uses another client than the Subscriber of stream %q: give both the same redis.UniversalClient, so that the outputs and the Ack reach one server in one step",
			ErrNotAtomic, d.Stream)
	}
	st := &step{x: x, src: src, d: d, publishTopic: message.PublishTopicFromCtx(ctx)}
	st.w.keys = append(st.w.keys, d.Stream)
	if topic := st.publishTopic; topic != "" {
		if err := st.checkSlot(x.config.Publisher.config.KeyPrefix + topic); err != nil {
			return nil, err
		}
	}
	if m := markOf(ctx); m != nil {
		if err := st.checkSlot(m.key); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// commit sends the step, again after connection errors, within
// CommitTimeout, and settles the delivery when it committed or found the
// input superseded.
func (x *ExactlyOnce) commit(ctx context.Context, st *step, msg *message.Message) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), x.config.CommitTimeout)
	defer cancel()
	wait := 20 * time.Millisecond
	for resent := false; ; resent = true {
		out, err := st.send(ctx)
		if err == nil && !out.committed && resent && out.why == whyAcknowledged {
			// A try before this one may have committed and lost its
			// reply: the input is acknowledged now, most likely by it.
			out.committed = true
		}
		switch {
		case err == nil && out.committed:
			st.d.SettleAcknowledged()
			x.countCommitted(st)
			return nil
		case err == nil && out.changed != nil:
			x.stats.stateChanged.Add(1)
			st.abort()
			return fmt.Errorf("valkeystream: the step of message %s (entry %s of %q) wrote nothing: %w; the message comes back, and its handler reads the state again",
				msg.UUID, st.d.ID, st.d.Stream, out.changed)
		case err == nil:
			st.d.Settle()
			x.stats.superseded.Add(1)
			st.abort()
			x.logger.Info("The input is no longer this delivery's: its outputs are not written by this handling",
				watermill.LogFields{"message_uuid": msg.UUID, "entry_id": st.d.ID, "delivery_count": st.d.Count,
					"stream": st.d.Stream, "consumer_group": st.d.Group, "consumer": st.d.Consumer, "now": out.why})
			return nil
		case errors.Is(err, ErrNotReplicated):
			st.d.SettleAcknowledged()
			x.countCommitted(st)
			x.stats.notReplicated.Add(1)
			x.logger.Error("Outputs committed with their input, but not confirmed by enough replicas", err,
				watermill.LogFields{"message_uuid": msg.UUID, "entry_id": st.d.ID, "stream": st.d.Stream})
			return nil
		case ctx.Err() != nil || !failover.Symptom(err):
			// A reply of the script, or the caller's own end: sending it
			// again would get the same. A connection error or a failover
			// hides whether it ran; sent again, it finds out.
			x.stats.failed.Add(1)
			st.abort()
			return fmt.Errorf("valkeystream: committing the outputs of message %s with its Ack (entry %s of %q, group %q): %w; it comes back",
				msg.UUID, st.d.ID, st.d.Stream, st.d.Group, err)
		}
		x.config.Publisher.failed(err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// countCommitted counts a committed step and tells its marks.
func (x *ExactlyOnce) countCommitted(st *step) {
	x.stats.committed.Add(1)
	x.stats.outputs.Add(int64(st.w.outputs))
	x.stats.stateWrites.Add(int64(st.w.stateWrites))
	st.committed()
}

// nonAtomic publishes the outputs of st the usual way, and leaves the
// input's Ack to the router (NonAtomicFallback), or refuses. A step with
// state writes or expectations is always refused: they have no plain way
// that keeps them once per input.
func (x *ExactlyOnce) nonAtomic(st *step, msg *message.Message) ([]*message.Message, error) {
	err := fmt.Errorf("%w: key %q is in another cluster hash slot than stream %q: give the topics one hash tag, such as {orders}.in and {orders}.out (docs/reliability.md)",
		ErrNotAtomic, st.crossSlot, st.d.Stream)
	if st.w.stateWrites > 0 || st.w.checks {
		err = fmt.Errorf("%w; the handler's state writes cannot fall back to a plain write (NonAtomicFallback applies to outputs only)", err)
	}
	if !x.config.NonAtomicFallback || st.w.stateWrites > 0 || st.w.checks {
		x.stats.refused.Add(1)
		st.abort()
		return nil, err
	}
	x.stats.nonAtomic.Add(1)
	for _, o := range st.plain {
		if perr := o.pub.Publish(o.topic, withoutStep(o.msgs)...); perr != nil {
			st.abort()
			return nil, perr
		}
	}
	st.fellBack() // a Deduplicator writes its own mark, as after a plain handling
	return nil, nil
}

// withoutStep returns copies of msgs whose contexts carry no step, for a
// plain Publish.
func withoutStep(msgs []*message.Message) []*message.Message {
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		c := m.Copy()
		c.SetContext(context.WithValue(m.Context(), stepKey{}, (*step)(nil)))
		out[i] = c
	}
	return out
}

// stepSource is what a group subscription puts in its messages' contexts
// for ExactlyOnce: the client the step runs on, and how it acknowledges.
type stepSource struct {
	client      redis.UniversalClient
	deleteAcked bool
}

type stepSourceKey struct{}

// withStepSource returns ctx carrying the step source of a Subscriber.
func (s *Subscriber) withStepSource(ctx context.Context) context.Context {
	return context.WithValue(ctx, stepSourceKey{}, &stepSource{client: s.config.Client, deleteAcked: s.config.DeleteAcked})
}
