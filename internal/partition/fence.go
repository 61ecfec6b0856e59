package partition

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Fence is the local side of an ownership's fencing: whether this process
// may still hand a message of the partition to a handler, by its own
// monotonic clock, without asking the server. It is valid until the owner
// record may lapse within Margin (no renewal reached the server for nearly
// the TTL: a cut, a stall, a frozen process), and never again once Lapse
// was called (the driver found the ownership lost, or gave it up). The
// server fences every read and Ack of a lost owner; the Fence covers what
// the server cannot see: the hand-over of a message already read, and the
// handling of one already handed over (see Context).
type Fence struct {
	until  func() time.Time // the earliest time the record may lapse (Ownership.Until)
	margin time.Duration
	now    func() time.Time

	lapsed context.Context // cancelled by Lapse, with its cause
	lapse  context.CancelCauseFunc
}

// NewFence returns the fence of an ownership whose record may lapse at
// until() at the earliest: valid while now() is more than margin before
// it. now is time.Now outside tests.
func NewFence(until func() time.Time, margin time.Duration, now func() time.Time) *Fence {
	f := &Fence{until: until, margin: margin, now: now}
	f.lapsed, f.lapse = context.WithCancelCause(context.Background())
	return f
}

// Valid reports whether a message of the partition may be handed to a
// handler now.
func (f *Fence) Valid() bool {
	return f.lapsed.Err() == nil && f.remaining() > 0
}

// remaining is the time left before the fence stops being valid by the
// clock (Lapse aside); zero or less: it is not.
func (f *Fence) remaining() time.Duration {
	return f.until().Add(-f.margin).Sub(f.now())
}

// Lapse ends the fence for good, with err as the reason: every message
// context of Context is cancelled, and Valid is false from now on.
func (f *Fence) Lapse(err error) { f.lapse(err) }

// Lapsed is closed once Lapse was called.
func (f *Fence) Lapsed() <-chan struct{} { return f.lapsed.Done() }

// err is the error of a message context that the fence ended.
func (f *Fence) err() error {
	if cause := context.Cause(f.lapsed); cause != nil {
		return fmt.Errorf("%w (%w)", context.Canceled, cause)
	}
	return fmt.Errorf("%w (%w: the ownership of the partition may have lapsed at %s by this host's clock: no renewal reached the server in time)",
		context.Canceled, ErrFenced, f.until().Format(time.RFC3339Nano))
}

// Context returns parent, a message's context, ended also when the fence
// is no longer valid: at Lapse, and at any call of Err once the clock has
// passed the fence, whether or not anything in the process has run since
// (a process frozen past the TTL and thawed has a handler that may ask
// before the driver's beat notices). A handler that checks its message's
// context before its side effects so never starts them on a partition
// another member may own. Its Deadline and Values are parent's.
//
// It costs one allocation until something asks for its Done channel (a
// router handler that never waits on its context does not): only then does
// it watch its parent and the fence, so that the channel is closed when
// either ends. Err asks both itself.
func (f *Fence) Context(parent context.Context) context.Context {
	return &fencedContext{Context: parent, fence: f}
}

// fencedContext is a message context ended by its parent or by its fence.
type fencedContext struct {
	context.Context
	fence *Fence
	err   atomic.Pointer[error] // set once, by end

	mu    sync.Mutex
	done  chan struct{} // made by the first Done
	stops []func() bool // unregister the watches of Done, once ended
}

// end ends the context with err, unless it has ended already, and
// unregisters what would end it.
func (c *fencedContext) end(err error) {
	c.mu.Lock()
	if c.err.Load() != nil {
		c.mu.Unlock()
		return
	}
	c.err.Store(&err)
	if c.done != nil {
		close(c.done)
	}
	stops := c.stops
	c.stops = nil
	c.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// Done returns the channel closed when the context ends; the first call
// makes it and starts watching the parent and the fence.
func (c *fencedContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err.Load() != nil {
		close(c.done)
		return c.done
	}
	// Each watch runs on a goroutine of its own (at once when its context
	// has ended already), after this call has let go of mu.
	parent, f := c.Context, c.fence
	c.stops = []func() bool{
		context.AfterFunc(parent, func() { c.end(parent.Err()) }),
		context.AfterFunc(f.lapsed, func() { c.end(f.err()) }),
	}
	return c.done
}

// Err is the context's error. It checks the parent, then the fence (its
// lapse and the clock), and ends the context at the first that ended.
func (c *fencedContext) Err() error {
	if e := c.err.Load(); e != nil {
		return *e
	}
	if err := c.Context.Err(); err != nil {
		c.end(err)
	} else if !c.fence.Valid() {
		c.end(c.fence.err())
	} else {
		return nil
	}
	return *c.err.Load()
}
