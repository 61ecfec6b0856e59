package valkeystream

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxCombined bounds how many messages one shared round trip carries. A call
// with more messages still goes in one round trip of its own.
const maxCombined = 1000

// combiner shares round trips among concurrent Publish calls. There is no
// writer goroutine: the call that finds no round trip in progress leads one,
// sending its own messages together with those of every call that queued
// meanwhile; then it hands the lead to the first call that queued after it
// took the batch, or ends it. A lone caller therefore pays no hand-off, and
// many callers pay one round trip per batch instead of one each.
type combiner struct {
	client redis.UniversalClient

	mu      sync.Mutex
	waiting []*writeRequest // queued calls, oldest first
	leading bool            // a call is leading a round trip; waiting is empty otherwise
}

// writeRequest is one Publish call's messages on their way to the server.
type writeRequest struct {
	ctx  context.Context
	args []redis.XAddArgs
	errs []error // per message; nil when the server accepted it

	// done receives false when the messages were sent (errs is final), or
	// true when this call must lead the next round trip.
	done chan bool
}

// write sends r's messages, in one round trip shared with other calls, and
// fills r.errs. It returns after the server answered for them, or after r.ctx
// ended before they were sent.
func (c *combiner) write(r *writeRequest) {
	r.errs = make([]error, len(r.args))
	c.mu.Lock()
	c.waiting = append(c.waiting, r)
	if c.leading {
		r.done = make(chan bool, 1)
		c.mu.Unlock()
		if lead := <-r.done; !lead {
			return
		}
	} else {
		c.leading = true
		c.mu.Unlock()
	}
	c.lead()
}

// lead sends one batch, which begins with the leading call's own request,
// then passes the lead on and releases the other calls of the batch.
func (c *combiner) lead() {
	c.mu.Lock()
	n, messages := 0, 0
	for n < len(c.waiting) && (n == 0 || messages+len(c.waiting[n].args) <= maxCombined) {
		messages += len(c.waiting[n].args)
		n++
	}
	batch := make([]*writeRequest, n)
	copy(batch, c.waiting)
	c.waiting = c.waiting[n:]
	c.mu.Unlock()

	c.send(batch)

	c.mu.Lock()
	if len(c.waiting) == 0 {
		c.leading = false
		c.waiting = nil // let the backing array go
	} else {
		c.waiting[0].done <- true
	}
	c.mu.Unlock()
	for _, r := range batch[1:] {
		r.done <- false
	}
}

// send writes the batch in one round trip. A batch of one call is bounded by
// that call's context; a shared one only by the client's timeouts, after the
// calls whose context already ended were left out.
func (c *combiner) send(batch []*writeRequest) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		ctx = context.Background()
		live := batch[:0:0]
		for _, r := range batch {
			if err := r.ctx.Err(); err != nil {
				fillErr(r.errs, err)
				continue
			}
			live = append(live, r)
		}
		batch = live
	}
	if len(batch) == 1 && len(batch[0].args) == 1 {
		batch[0].errs[0] = c.client.XAdd(ctx, &batch[0].args[0]).Err()
		return
	}
	pipe := c.client.Pipeline()
	cmds := make([]*redis.StringCmd, 0, maxCombined)
	for _, r := range batch {
		for i := range r.args {
			cmds = append(cmds, pipe.XAdd(ctx, &r.args[i]))
		}
	}
	if len(cmds) == 0 {
		return
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, r := range batch {
		for i := range r.errs {
			r.errs[i] = cmds[0].Err()
			cmds = cmds[1:]
		}
	}
}

func fillErr(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}
