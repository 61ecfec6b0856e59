// Package coalesce sends the commands of concurrent callers on one client
// in shared pipelines: a [Pipes] takes each caller's commands, and sends
// those that wait together in one round trip, a few round trips in flight
// at most. It is for bursts of small calls that all want a connection at
// once, such as the last Acks and the consumer-name releases of many
// subscriptions ending in one Close on a small pool: one round trip each
// would queue for the pool's few connections past the bound they have.
package coalesce

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipes shares pipelines among the callers of Exec on one client. Its zero
// value is not usable: see New. It is safe for concurrent use.
type Pipes struct {
	client redis.UniversalClient
	max    int

	mu      sync.Mutex
	queue   []*call // waiting for a round trip
	leaders int     // round trips being sent (goroutines of lead)
}

// call is one caller's commands.
type call struct {
	ctx   context.Context
	cmds  []redis.Cmder
	taken bool          // in a round trip: its commands are the round trip's until done
	done  chan struct{} // closed when the round trip carrying it returned
}

// New returns the Pipes of client, with up to inFlight round trips in
// flight at once (at least 1): half a pool's connections, say, so that the
// other calls on the pool keep some.
func New(client redis.UniversalClient, inFlight int) *Pipes {
	return &Pipes{client: client, max: max(1, inFlight)}
}

// Exec sends cmds in a round trip shared with the other callers' that wait
// meanwhile, and returns once their replies (or errors) are in them. When
// ctx ends before they were sent, it returns at once, each command with
// ctx's error. A round trip ends at the latest deadline of the calls it
// carries (none, when one of them has none), so a call sent before its ctx
// ended waits for its round trip: its commands are not to be read while
// the round trip may still write them.
func (p *Pipes) Exec(ctx context.Context, cmds []redis.Cmder) {
	if len(cmds) == 0 {
		return
	}
	c := &call{ctx: ctx, cmds: cmds, done: make(chan struct{})}
	p.mu.Lock()
	p.queue = append(p.queue, c)
	if p.leaders < p.max {
		p.leaders++
		go p.lead()
	}
	p.mu.Unlock()
	select {
	case <-c.done:
		return
	case <-ctx.Done():
	}
	p.mu.Lock()
	if !c.taken {
		p.queue = slices.DeleteFunc(p.queue, func(q *call) bool { return q == c })
		p.mu.Unlock()
		for _, cmd := range cmds {
			cmd.SetErr(ctx.Err())
		}
		return
	}
	p.mu.Unlock()
	<-c.done
}

// lead sends round trips of what waits until nothing does.
func (p *Pipes) lead() {
	for {
		p.mu.Lock()
		batch := p.queue
		p.queue = nil
		if len(batch) == 0 {
			p.leaders--
			p.mu.Unlock()
			return
		}
		for _, c := range batch {
			c.taken = true
		}
		p.mu.Unlock()
		p.send(batch)
	}
}

// send sends batch's commands in one pipeline.
func (p *Pipes) send(batch []*call) {
	ctx, cancel := latest(batch)
	defer cancel()
	var all []redis.Cmder
	for _, c := range batch {
		all = append(all, c.cmds...)
	}
	pipe := p.client.Pipeline()
	_ = pipe.BatchProcess(ctx, all...)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, c := range batch {
		close(c.done)
	}
}

// latest returns the context of a round trip carrying batch: the first
// call's values, no cancellation, and the latest of their deadlines (none
// if one has none).
func latest(batch []*call) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(batch[0].ctx)
	var last time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return base, func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(base, last)
}
