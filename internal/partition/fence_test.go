package partition

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a clock that moves only when told: a jump is a process
// frozen meanwhile, during which nothing in it ran.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
	// read gets a value (when there is room) each time the clock is read.
	read chan struct{}
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now(), read: make(chan struct{}, 1)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	now := c.now
	c.mu.Unlock()
	// Told after the time was read: a jump the reader of read makes next
	// is one this read did not see.
	select {
	case c.read <- struct{}{}:
	default:
	}
	return now
}

func (c *fakeClock) jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testFence is a fence whose record lapses at until, valid until a second
// before it, by clock.
func testFence(clock *fakeClock, until time.Time) *Fence {
	return NewFence(func() time.Time { return until }, time.Second, clock.Now)
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestFenceIsValidUntilItsMarginBeforeTheRecordMayLapse(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	assert.True(t, f.Valid())
	clock.jump(9*time.Second - time.Nanosecond)
	assert.True(t, f.Valid(), "just before the margin")
	clock.jump(time.Nanosecond)
	assert.False(t, f.Valid(), "at the margin")
}

func TestALapsedFenceStaysInvalid(t *testing.T) {
	clock := newFakeClock()
	until := clock.Now().Add(10 * time.Second)
	f := NewFence(func() time.Time { return until }, time.Second, clock.Now)
	assert.False(t, closed(f.Lapsed()))
	f.Lapse(ErrFenced)
	assert.True(t, closed(f.Lapsed()))
	assert.False(t, f.Valid(), "lapsed, although the clock is far from the record's lapse")
}

// A process frozen past its ownership and thawed: nothing ran meanwhile,
// no timer fired, no beat noticed; the handler's first question already
// gets the end.
func TestAMessageContextEndsOnTheClockWithNothingRunning(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := f.Context(parent)
	require.NoError(t, ctx.Err())
	assert.False(t, closed(ctx.Done()))

	clock.jump(20 * time.Second)
	err := ctx.Err()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, ErrFenced)
	assert.True(t, closed(ctx.Done()), "Done is closed before Err answers")
	assert.NoError(t, parent.Err(), "the parent is not the fence's to end")
}

func TestAMessageContextEndsWhenTheFenceLapses(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	ctx := f.Context(context.Background())
	cause := errors.New("renewal refused")
	f.Lapse(cause)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context did not end with its fence")
	}
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.ErrorIs(t, ctx.Err(), cause)
}

type ctxKey struct{}

func TestAMessageContextEndsWithItsParentAndKeepsItsValues(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	ctx := f.Context(parent)
	assert.Equal(t, "v", ctx.Value(ctxKey{}))
	cancel()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context did not end with its parent")
	}
	assert.Equal(t, context.Canceled, ctx.Err())
	f.Lapse(ErrFenced)
	assert.Equal(t, context.Canceled, ctx.Err(), "the first end is the one kept")
}

// A fence made for an ended parent, or one that has lapsed, ends the new
// context at once.
func TestAMessageContextOfAnEndedParentOrFenceEndsAtOnce(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	parent, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := f.Context(parent)
	assert.Equal(t, context.Canceled, ctx.Err())

	f.Lapse(ErrFenced)
	ctx = f.Context(context.Background())
	assert.ErrorIs(t, ctx.Err(), ErrFenced)
}

// A context whose Done nobody asked for (a router handler that never waits
// on it) still ends: Err asks its parent and its fence, and a Done asked
// for afterwards is closed already.
func TestAMessageContextEndsWithoutItsDoneBeingAskedFor(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	parent, cancel := context.WithCancel(context.Background())
	ctx := f.Context(parent)
	cancel()
	assert.Equal(t, context.Canceled, ctx.Err())
	assert.True(t, closed(ctx.Done()))

	ctx = f.Context(context.Background())
	f.Lapse(ErrFenced)
	assert.ErrorIs(t, ctx.Err(), ErrFenced)
	assert.True(t, closed(ctx.Done()))
}

// Done and Err from many goroutines while the fence lapses: one end, seen
// alike by all (run with -race).
func TestAMessageContextEndsOnceForEveryone(t *testing.T) {
	clock := newFakeClock()
	f := testFence(clock, clock.Now().Add(10*time.Second))
	ctx := f.Context(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			<-ctx.Done()
			errs <- ctx.Err()
		})
	}
	f.Lapse(ErrFenced)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.ErrorIs(t, err, ErrFenced)
		assert.Same(t, ctx.Err(), err, "every goroutine sees the one error the context ended with")
	}
}
