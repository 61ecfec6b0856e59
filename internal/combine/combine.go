// Package combine shares the round trips of concurrent XADD calls for one
// stream: a Publisher hands each call's messages to a [Combiner], which
// sends them together with those of the other calls for the same stream,
// up to maxLeaders round trips in flight per stream, and reports each
// message's outcome.
package combine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxCombined bounds how many messages one shared round trip carries. A call
// with more messages still goes in one round trip of its own.
const maxCombined = 1000

// maxLeaders bounds the round trips in flight at once for one stream. A
// call released by one round trip waits for the next to leave: with few
// in flight, and their answers coming back together, that wait is most of
// a round trip, which at a distance halves what many publishing goroutines
// get (64 goroutines at a 2.6 ms round trip: 11k/s with two, 15.6k/s with
// eight, go-redis alone with one connection each 13k/s). At loopback the
// batches stay large either way.
const maxLeaders = 8

// ErrUnsent is wrapped by the error of a call that was never sent: its
// context ended while it waited for a round trip.
var ErrUnsent = errors.New("not sent")

// ErrSendAborted is the outcome of calls carried in a round trip whose
// sending panicked (in a client hook, say) in the goroutine of another call.
var ErrSendAborted = errors.New("valkeystream: publish: the shared round trip was aborted by a panic in another Publish call; the messages may not have been written")

// Combiner keeps one stream combiner per stream key while calls for that key
// are in progress, so that a slow key (or a cluster shard failing over)
// holds up only the calls for that key. It is safe for concurrent use.
type Combiner struct {
	client    redis.UniversalClient
	wait      ReplicaWait
	roundTrip func(messages int)

	mu    sync.Mutex
	byKey map[string]*stream
}

// New returns a Combiner that writes with client and applies wait to every
// round trip. roundTrip, unless nil, is told of each round trip as it is
// sent, with the number of messages it carries.
func New(client redis.UniversalClient, wait ReplicaWait, roundTrip func(messages int)) *Combiner {
	return &Combiner{client: client, wait: wait, roundTrip: roundTrip}
}

// Write sends r's messages, all for stream key, in one round trip shared
// with other calls for the same key, and fills r.Errs. It returns after the
// server answered for them, or as soon as ctx ends while they wait to be
// sent (each message's error is then ctx's). A round trip of r's own ends
// with ctx; one shared with other calls at the latest of their deadlines, if
// each has one.
func (c *Combiner) Write(ctx context.Context, key string, r *Request) {
	r.ctx = ctx
	c.mu.Lock()
	s := c.byKey[key]
	if s == nil {
		if c.byKey == nil {
			c.byKey = make(map[string]*stream)
		}
		s = &stream{client: c.client, roundTrip: c.roundTrip, wait: c.wait, key: key}
		c.byKey[key] = s
	}
	s.users++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		s.users--
		if s.users == 0 {
			delete(c.byKey, key)
		}
		c.mu.Unlock()
	}()
	s.write(r)
}

// stream shares round trips among concurrent calls for one stream key.
// There is no writer goroutine: a call that finds fewer than maxLeaders
// round trips in progress leads one, sending its own messages together with
// those of every call queued so far; when the answer comes it hands the lead
// to the oldest call still queued, or gives it up. A lone caller therefore
// pays no hand-off, and many callers pay one round trip per batch instead of
// one each.
type stream struct {
	client    redis.UniversalClient
	roundTrip func(messages int) // nil counts nothing
	wait      ReplicaWait
	key       string
	users     int // calls in Write; guarded by Combiner.mu

	mu      sync.Mutex
	waiting []*Request // queued calls, oldest first
	leaders int        // calls leading a round trip; waiting is empty while below maxLeaders
}

// Request is one call's messages on their way to the server: fill Args, pass
// it to [Combiner.Write], then read Errs.
type Request struct {
	Args []redis.XAddArgs // the messages, in call order
	Errs []error          // per message; nil when the server accepted it

	// Marks, when set, makes each message's XADD idempotent by script (see
	// [MarkScript]): Marks[i], unless empty, is the key, in the stream's
	// slot, that remembers for MarkTTL milliseconds the id that message i
	// got. An Args
	// entry with ProducerID and IdempotentID set is idempotent on the
	// server (XADD ... IDMP). Idempotent messages may be sent again by the
	// client after a connection error; the others never are.
	Marks   []string
	MarkTTL int64

	ctx context.Context // the call's, from Write

	// one and oneErr hold Args and Errs of a call with one message, the
	// most common, so that it costs one allocation instead of three.
	one    [1]redis.XAddArgs
	oneErr [1]error

	// done receives false when the messages were sent (Errs is final), or
	// true, under stream.mu, when this call must lead the next round trip.
	// It receives once.
	done chan bool
}

// NewRequest returns a request for n messages, its Args to be filled.
func NewRequest(n int) *Request {
	r := &Request{}
	if n == 1 {
		r.Args, r.Errs = r.one[:], r.oneErr[:]
	} else {
		r.Args, r.Errs = make([]redis.XAddArgs, n), make([]error, n)
	}
	return r
}

func (s *stream) write(r *Request) {
	s.mu.Lock()
	if s.leaders < maxLeaders {
		s.leaders++
		s.mu.Unlock()
		s.lead(r)
		return
	}
	r.done = make(chan bool, 1)
	s.waiting = append(s.waiting, r)
	s.mu.Unlock()
	var lead bool
	select {
	case lead = <-r.done:
	case <-r.ctx.Done():
		lead = s.giveUp(r)
	}
	if lead {
		s.lead(r)
	}
}

// giveUp handles a queued call whose context ended: if it is still queued it
// leaves the queue with the context's error and nothing sent; if it was
// already taken into a round trip it waits for the answer. It reports
// whether the call must lead a round trip after all.
func (s *stream) giveUp(r *Request) (lead bool) {
	s.mu.Lock()
	select {
	case lead = <-r.done:
		s.mu.Unlock()
		return lead
	default:
	}
	if i := slices.Index(s.waiting, r); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
		s.mu.Unlock()
		fillErr(r.Errs, r.ctx.Err())
		return false
	}
	s.mu.Unlock()
	return <-r.done
}

// lead sends self's messages with those of the calls queued so far, then
// passes the lead on to the oldest call still queued (or gives it up) and
// releases the other calls of the batch, even if sending panicked (a client
// hook may panic).
func (s *stream) lead(self *Request) {
	s.mu.Lock()
	n, messages := 0, len(self.Args)
	for n < len(s.waiting) && messages+len(s.waiting[n].Args) <= maxCombined {
		messages += len(s.waiting[n].Args)
		n++
	}
	batch := make([]*Request, 0, n+1)
	batch = append(append(batch, self), s.waiting[:n]...)
	s.waiting = s.waiting[n:]
	s.mu.Unlock()

	sent := false
	defer func() {
		if !sent {
			for _, r := range batch {
				fillErr(r.Errs, ErrSendAborted)
			}
		}
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.leaders--
			s.waiting = nil // let the backing array go
		} else {
			next := s.waiting[0]
			s.waiting = s.waiting[1:]
			next.done <- true
		}
		s.mu.Unlock()
		for _, r := range batch[1:] {
			r.done <- false
		}
	}()
	s.send(batch)
	sent = true
}

// send writes the batch in one round trip. A batch of one call is bounded by
// that call's context. A shared one leaves out the calls whose context
// already ended, keeps the values of the leader's context (for tracing
// hooks), and ends at the latest deadline among the calls, if each has one.
func (s *stream) send(batch []*Request) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		live := batch[:0:0]
		for _, r := range batch {
			if err := r.ctx.Err(); err != nil {
				fillErr(r.Errs, fmt.Errorf("%w: %w", ErrUnsent, err))
				continue
			}
			live = append(live, r)
		}
		if len(live) == 0 {
			return
		}
		batch = live
		var cancel context.CancelFunc
		ctx, cancel = sharedContext(batch)
		defer cancel()
	}
	if s.roundTrip != nil {
		s.roundTrip(countArgs(batch))
	}
	if s.wait.Replicas == 0 && len(batch) == 1 && len(batch[0].Args) == 1 {
		r := batch[0]
		cmd := command(ctx, r, 0, false)
		_ = s.client.Process(ctx, cmd)
		if noScript(cmd) {
			// EVAL loads the script, with no permission beyond the one
			// to run it; a refused EVALSHA did not run.
			cmd = command(ctx, r, 0, true)
			_ = s.client.Process(ctx, cmd)
		}
		r.Errs[0] = cmd.Err()
		return
	}
	type message struct {
		r *Request
		i int
	}
	msgs := make([]message, 0, countArgs(batch))
	cmds := make([]redis.Cmder, 0, cap(msgs))
	for _, r := range batch {
		for i := range r.Args {
			msgs = append(msgs, message{r, i})
			cmds = append(cmds, command(ctx, r, i, false))
		}
	}
	notReplicated, err := s.pipeline(ctx, cmds)
	if err != nil {
		for _, r := range batch {
			fillErr(r.Errs, err)
		}
		return
	}
	// Commands refused for want of the script did not run: send those
	// again with EVAL, which loads it (on a cluster, nodes that had it ran
	// theirs).
	var again []int
	var resend []redis.Cmder
	for n, c := range cmds {
		if noScript(c) {
			again = append(again, n)
			resend = append(resend, command(ctx, msgs[n].r, msgs[n].i, true))
		}
	}
	if len(resend) > 0 {
		short, err := s.pipeline(ctx, resend)
		for k, n := range again {
			if err != nil {
				resend[k].SetErr(err)
			}
			cmds[n] = resend[k]
		}
		if notReplicated == nil {
			notReplicated = short
		}
	}
	for n, m := range msgs {
		m.r.Errs[m.i] = cmds[n].Err()
		if m.r.Errs[m.i] == nil {
			m.r.Errs[m.i] = notReplicated
		}
	}
}

// pipeline sends cmds in one round trip, followed by WAIT when replicas
// are to be waited for. It returns the check of the WAIT reply, or the
// error of a pipeline that could not be made; each command carries its own
// error.
func (s *stream) pipeline(ctx context.Context, cmds []redis.Cmder) (notReplicated, err error) {
	pipe, err := s.wait.Pipeline(ctx, s.client, s.key)
	if err != nil {
		return nil, err
	}
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	var wait *redis.IntCmd
	if s.wait.Replicas > 0 {
		wait = s.wait.command(ctx)
		_ = pipe.Process(ctx, wait)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return s.wait.check(wait), nil
}

// sharedContext is the context of a round trip shared by batch: the values of
// the first call's context, and the latest of the calls' deadlines when every
// call has one.
func sharedContext(batch []*Request) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, r := range batch {
		d, ok := r.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}

// countArgs returns how many messages batch carries.
func countArgs(batch []*Request) int {
	n := 0
	for _, r := range batch {
		n += len(r.Args)
	}
	return n
}

func fillErr(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// command returns the command that writes message i of r: its XADD, or,
// with r.Marks, the call of MarkScript (by EVAL when eval, else by
// EVALSHA). A command that is not idempotent is wrapped in once.
func command(ctx context.Context, r *Request, i int, eval bool) redis.Cmder {
	a := &r.Args[i]
	if r.Marks == nil || r.Marks[i] == "" {
		cmd := xadd(ctx, a)
		if a.ProducerID != "" && a.IdempotentID != "" {
			return cmd
		}
		return once{cmd}
	}
	return markedAdd(ctx, a, r.Marks[i], r.MarkTTL, eval)
}

// noScript reports whether c was refused because the server lacks the
// script (NOSCRIPT): it did not run.
func noScript(c redis.Cmder) bool {
	return redis.HasErrorPrefix(c.Err(), "NOSCRIPT")
}

// once is a command that the client never sends again after a connection
// error (go-redis retries a command or pipeline MaxRetries times unless one
// of its commands says NoRetry): an XADD sent twice stores its message
// twice. A pipeline that carries one is not sent again either.
type once struct{ *redis.StringCmd }

func (once) NoRetry() bool { return true }

// xadd is the XADD of a, for the fields a Publisher sets (Stream, Values
// as alternating fields and values, Mode, ProducerID and IdempotentID,
// MaxLen or MinID, Approx), laid out as go-redis' XAdd lays them out.
func xadd(ctx context.Context, a *redis.XAddArgs) *redis.StringCmd {
	values, _ := a.Values.([]any)
	args := make([]any, 0, 12+len(values))
	args = append(args, "xadd", a.Stream)
	if a.Mode != "" {
		args = append(args, a.Mode)
	}
	if a.ProducerID != "" && a.IdempotentID != "" {
		args = append(args, "idmp", a.ProducerID, a.IdempotentID)
	}
	switch {
	case a.MaxLen > 0:
		if a.Approx {
			args = append(args, "maxlen", "~", a.MaxLen)
		} else {
			args = append(args, "maxlen", a.MaxLen)
		}
	case a.MinID != "":
		if a.Approx {
			args = append(args, "minid", "~", a.MinID)
		} else {
			args = append(args, "minid", a.MinID)
		}
	}
	if a.ID != "" {
		args = append(args, a.ID)
	} else {
		args = append(args, "*")
	}
	args = append(args, values...)
	return redis.NewStringCmd(ctx, args...)
}
