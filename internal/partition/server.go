package partition

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/loop"
)

// handedBackIdle is the idle time of entries handed back, as the loop's
// RedisServer gives them. No claim beat runs on a partition, so the time
// says nothing to a peer; the next owner's hand-over takes them whatever
// their idle time.
const handedBackIdle = 30 * 24 * time.Hour

// errNoClaims is the error of Server.Claim.
var errNoClaims = errors.New("partition: a partition's entries are never claimed by idle time, only handed over to its next owner; run its loop with a negative ClaimInterval")

// Server is the loop.Server of one owned partition: a subscription's loop
// handles the partition through it as through a RedisServer, and every call
// that reads, acknowledges or holds entries is checked against the
// ownership on the server in the same step (see [Ownership]). A call made
// after the ownership was lost returns an error wrapping ErrFenced and
// changes nothing; Failed tells ServerOptions.Lost of it, once, which ends
// the partition's subscription.
//
// What it keeps of RedisServer (internal/loop/redis.go):
//   - every call returns when its context ends (internal/bounded);
//   - a pipeline that reads new entries is never sent again by the client
//     (a read sent twice would leave entries pending unseen);
//   - Acks, reads and hand-backs of a Trip go in one pipeline, in that
//     order; the server's NOGROUP comes back as it came;
//   - Hold and ClaimBack answer as RedisServer's scripts do;
//   - hand-backs and deferred entries are XCLAIM ... IDLE ... JUSTID on
//     the owner's own name;
//   - Failed consults the failover hints of the client;
//   - Interrupt ends a Block in progress, and every later one, at once.
//
// What it drops:
//   - Claim (XAUTOCLAIM): a partition is handled by its owner alone, and
//     what a previous owner left is taken by the hand-over (HandOver);
//   - reads that claim (XREADGROUP ... CLAIM) and XACKDEL: the verbs of
//     newer servers are not probed; Acks are XACK;
//   - the blocking reader of its own connection: Block waits with a plain
//     XREAD BLOCK through the client, which takes no entry, so that a lost
//     owner's wait takes nothing either; a Block cut short by Interrupt
//     leaves its XREAD to end within its block time;
//   - ListOwn is not fenced: it only lists, and the Hold that follows it
//     is.
type Server struct {
	o    *Ownership
	opt  ServerOptions
	stop context.Context // ended by Interrupt
	end  context.CancelFunc
	once sync.Once // for Lost
}

// ServerOptions are what a Server reads of its subscription.
type ServerOptions struct {
	// Hints are the Subscriber's failover hints for the client; nil: none.
	Hints *failover.Hints
	// Lost is told, once, of the first failed call that found the
	// ownership lost; nil: nobody is. It should end the partition's
	// subscription: no call of it will succeed again.
	Lost func(err error)
	// Waits, unless nil, bounds how many blocking waits for new entries
	// (XREAD BLOCK, one pooled connection each) the Servers sharing it
	// have in progress at once: a wait that finds no room for the block
	// time returns empty, and the loop reads again (fenced) after it.
	Waits chan struct{}
}

// NewServer returns the Server of the partition o owns.
func NewServer(o *Ownership, opt ServerOptions) *Server {
	stop, end := context.WithCancel(context.Background())
	return &Server{o: o, opt: opt, stop: stop, end: end}
}

var _ loop.Server = (*Server)(nil)

// noRetry is a command the client never sends again after a connection
// error; a pipeline that carries one is not sent again either.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// queued is one fenced script of a Trip's pipeline.
type queued struct {
	op     string
	script *redis.Script
	args   []any
	cmd    *redis.Cmd
}

// Send sends t's Acks, its reads of new entries (one read of their total)
// and its hand-backs in one pipeline, each a fenced script.
func (s *Server) Send(ctx context.Context, t loop.Trip) loop.TripReply {
	var r loop.TripReply
	if err := bounded.Call(ctx, func() { r = s.send(ctx, t) }); err != nil {
		return loop.TripReply{AckErr: err, ReadErr: err, BackErr: err}
	}
	return r
}

func (s *Server) send(ctx context.Context, t loop.Trip) loop.TripReply {
	o := s.o
	var ack, read *queued
	var back []*queued
	var calls []*queued
	if len(t.Acks) > 0 {
		ack = &queued{op: "ack", script: ackScript, args: o.groupArgs(t.Acks)}
		calls = append(calls, ack)
	}
	var asked int64
	for _, n := range t.Reads {
		asked += n
	}
	if asked > 0 {
		read = &queued{op: "read", script: readScript, args: o.args(asked, ">")}
		calls = append(calls, read)
	}
	if len(t.HandBack) > 0 {
		back = append(back, &queued{op: "hand-back", script: handBackScript,
			args: o.args(append([]any{handedBackIdle.Milliseconds()}, toAny(t.HandBack)...)...)})
	}
	for _, l := range t.Later {
		back = append(back, &queued{op: "hand-back", script: handBackScript, args: o.args(l.Idle.Milliseconds(), l.ID)})
	}
	calls = append(calls, back...)
	s.run(ctx, calls, read != nil)

	var r loop.TripReply
	if ack != nil {
		rest, err := o.check(ack.op, ack.cmd)
		if err == nil {
			r.Acked, err = parseCount(rest)
		}
		r.AckErr = err
	}
	if read != nil {
		rest, err := o.check(read.op, read.cmd)
		if err == nil {
			r.Entries, _, err = parseReadTop(rest)
		}
		r.ReadErr = err
		r.Full = err == nil && int64(len(r.Entries)) == asked
	}
	for _, b := range back {
		_, err := o.check(b.op, b.cmd)
		r.BackErr = errors.Join(r.BackErr, err)
	}
	return r
}

// run sends calls in one pipeline of EVALSHA, never sent again when once;
// each one the server did not have the script of (NOSCRIPT, so it did not
// run) is sent again with its body.
func (s *Server) run(ctx context.Context, calls []*queued, once bool) {
	if len(calls) == 0 {
		return
	}
	keys := s.o.keys()
	pipe := s.o.p.client.Pipeline()
	for _, c := range calls {
		c.cmd = evalCmd(ctx, "evalsha", c.script.Hash(), keys, c.args)
		if once {
			_ = pipe.Process(ctx, noRetry{c.cmd})
		} else {
			_ = pipe.Process(ctx, c.cmd)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, c := range calls {
		if !redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			continue
		}
		c.cmd = evalCmd(ctx, "eval", sourceOf(c.script), keys, c.args)
		if once {
			_ = s.o.p.client.Process(ctx, noRetry{c.cmd})
		} else {
			_ = s.o.p.client.Process(ctx, c.cmd)
		}
	}
}

// evalCmd is EVAL or EVALSHA of script (a body or a hash) on keys.
func evalCmd(ctx context.Context, verb, script string, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, verb, script, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return redis.NewCmd(ctx, append(a, args...)...)
}

// Block reads up to count new entries, waiting up to block for the first:
// a fenced read; when it brings nothing, a plain XREAD BLOCK after the
// stream's last entry, which takes nothing; then a fenced read again.
func (s *Server) Block(ctx context.Context, count int64, block time.Duration) ([]loop.Entry, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stop, cancel)()
	var es []loop.Entry
	var err error
	if berr := bounded.Call(ctx, func() { es, err = s.block(ctx, count, block) }); berr != nil {
		return nil, berr
	}
	return es, err
}

func (s *Server) block(ctx context.Context, count int64, block time.Duration) ([]loop.Entry, error) {
	es, top, err := s.readNew(ctx, count)
	if err != nil || len(es) > 0 || block <= 0 || top == "" {
		return es, err
	}
	if s.opt.Waits != nil {
		t := time.NewTimer(block)
		select {
		case s.opt.Waits <- struct{}{}:
			t.Stop()
			defer func() { <-s.opt.Waits }()
		case <-t.C:
			return s.readNewOnly(ctx, count)
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	err = s.o.p.client.XRead(ctx, &redis.XReadArgs{Streams: []string{s.o.p.keys.Stream, top}, Count: 1, Block: block}).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil // nothing new within block
	case err != nil:
		return nil, err
	}
	es, _, err = s.readNew(ctx, count)
	return es, err
}

// readNewOnly runs the fenced read of new entries.
func (s *Server) readNewOnly(ctx context.Context, count int64) ([]loop.Entry, error) {
	es, _, err := s.readNew(ctx, count)
	return es, err
}

// readNew runs the fenced read of new entries: the entries, or none and
// the id after which new ones come.
func (s *Server) readNew(ctx context.Context, count int64) ([]loop.Entry, string, error) {
	c := &queued{op: "read", script: readScript, args: s.o.args(count, ">")}
	s.run(ctx, []*queued{c}, true)
	rest, err := s.o.check(c.op, c.cmd)
	if err != nil {
		return nil, "", err
	}
	return parseReadTop(rest)
}

// ReadOwn reads the owner's own pending entries after from, fenced.
func (s *Server) ReadOwn(ctx context.Context, from string, count int64) ([]loop.Entry, error) {
	var es []loop.Entry
	var err error
	if berr := bounded.Call(ctx, func() { es, err = s.o.Read(ctx, from, count) }); berr != nil {
		return nil, berr
	}
	return es, err
}

// ListOwn lists the ids of the owner's own pending entries with XPENDING
// (not fenced: it changes nothing).
func (s *Server) ListOwn(ctx context.Context, from string, count int64) ([]string, error) {
	return loop.ListPending(ctx, s.o.p.client, s.o.p.keys.Stream, s.o.p.group, s.o.token.Member, from, count)
}

// Claim is not used on a partition: it returns an error that says so.
func (s *Server) Claim(context.Context, string, int64) (loop.Claimed, error) {
	return loop.Claimed{}, fmt.Errorf("%w (stream %q)", errNoClaims, s.o.p.keys.Stream)
}

// Hold runs the fenced hold script.
func (s *Server) Hold(ctx context.Context, ids []string) ([]int64, error) {
	var counts []int64
	var err error
	if berr := bounded.Call(ctx, func() { counts, err = s.o.Hold(ctx, ids) }); berr != nil {
		return nil, berr
	}
	return counts, err
}

// ClaimBack runs the fenced nack claim script.
func (s *Server) ClaimBack(ctx context.Context, id string, count int64) (loop.ClaimedBack, error) {
	var c loop.ClaimedBack
	var err error
	if berr := bounded.Call(ctx, func() { c, err = s.o.ClaimBack(ctx, id, count) }); berr != nil {
		return loop.ClaimedBack{}, berr
	}
	return c, err
}

// Failed tells ServerOptions.Lost of a lost ownership, once, and returns
// the wait before the next try that the client's failover hints give.
func (s *Server) Failed(err error, delay time.Duration) time.Duration {
	if errors.Is(err, ErrFenced) && s.opt.Lost != nil {
		s.once.Do(func() { s.opt.Lost(err) })
	}
	if s.opt.Hints == nil {
		return delay
	}
	return s.opt.Hints.RetryDelay(s.o.p.client, err, delay)
}

// Interrupt ends a Block in progress, and every later one, at once.
func (s *Server) Interrupt() { s.end() }
