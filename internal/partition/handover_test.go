package partition

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// handOverEnv runs a HandOver of a fenced partition by a fake clock: in is
// the loop's side, out the handlers'.
type handOverEnv struct {
	clock   *fakeClock
	fence   *Fence
	in      chan *message.Message
	out     chan *message.Message
	stopped chan struct{} // closed by Stop
	late    chan struct{} // one per late hand-over
	ran     chan struct{} // closed when Run returned
	cancel  context.CancelFunc
}

// patience bounds every wait for an event of these tests: far above what
// the event takes, never reached when the rule holds.
const patience = 10 * time.Second

func newHandOverEnv(t *testing.T, until time.Duration) *handOverEnv {
	clock := newFakeClock()
	e := &handOverEnv{
		clock:   clock,
		fence:   testFence(clock, clock.Now().Add(until)),
		in:      make(chan *message.Message),
		out:     make(chan *message.Message),
		stopped: make(chan struct{}),
		late:    make(chan struct{}, 10),
		ran:     make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	var stopOnce bool
	h := HandOver{
		Fence: e.fence,
		Out:   e.out,
		Stop: func() {
			if !stopOnce { // called from Run's goroutine only
				stopOnce = true
				close(e.stopped)
			}
		},
		Mark: func(msg *message.Message) { msg.Metadata.Set("marked", "yes") },
		Late: func() { e.late <- struct{}{} },
	}
	go func() {
		defer close(e.ran)
		h.Run(ctx, ctx, e.in)
	}()
	t.Cleanup(func() {
		cancel()
		close(e.in)
		<-e.ran
	})
	return e
}

// offer gives msg to the HandOver, as the loop does.
func (e *handOverEnv) offer(t *testing.T, msg *message.Message) {
	t.Helper()
	select {
	case e.in <- msg:
	case <-time.After(patience):
		t.Fatal("the hand-over did not take the loop's message")
	}
}

// drain empties ch.
func drain(ch chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(patience):
		t.Fatal("waited in vain for " + what)
	}
}

func TestHandOverGivesMessagesWhileTheFenceIsValid(t *testing.T) {
	e := newHandOverEnv(t, time.Minute)
	for i := range 3 {
		msg := message.NewMessage(string(rune('a'+i)), nil)
		e.offer(t, msg)
		got := <-e.out
		require.Same(t, msg, got)
		assert.Equal(t, "yes", got.Metadata.Get("marked"))
		assert.NoError(t, got.Context().Err())
		got.Ack()
	}
	assert.False(t, closed(e.stopped))
	assert.Empty(t, e.late)
}

func TestHandOverRefusesAMessageOnceTheFenceIsPast(t *testing.T) {
	e := newHandOverEnv(t, time.Minute)
	e.clock.jump(time.Hour)
	msg := message.NewMessage("a", nil)
	e.offer(t, msg)
	waitClosed(t, msg.Nacked(), "the refused message's Nack")
	waitClosed(t, e.stopped, "the loop's stop")
	assert.Empty(t, e.out)
}

// An offer waiting for a handler is withdrawn at the lapse.
func TestHandOverWithdrawsAnOfferWhenTheFenceLapses(t *testing.T) {
	e := newHandOverEnv(t, time.Minute)
	msg := message.NewMessage("a", nil)
	e.offer(t, msg)
	e.fence.Lapse(ErrFenced)
	waitClosed(t, msg.Nacked(), "the withdrawn message's Nack")
	waitClosed(t, e.stopped, "the loop's stop")
	assert.Empty(t, e.out, "no handler may take it now")
}

// An offer waiting for a handler is withdrawn when the clock reaches the
// fence, with nothing else happening: the offer's timer looks again.
func TestHandOverWithdrawsAnOfferWhenTheClockReachesTheFence(t *testing.T) {
	e := newHandOverEnv(t, time.Second+20*time.Millisecond) // the offer's timer fires in 20 ms
	msg := message.NewMessage("a", nil)
	e.offer(t, msg)
	e.clock.jump(time.Hour)
	waitClosed(t, msg.Nacked(), "the withdrawn message's Nack")
	waitClosed(t, e.stopped, "the loop's stop")
}

// The freeze: an offer is armed, the process is frozen past the ownership
// (the clock jumps, nothing runs, no timer fires), and on the thaw a
// handler takes the message before anything in the process looked at a
// clock. The handler finds its context ended; the hand-over counts it late
// and stops the loop.
func TestAMessageTakenAfterAFreezeHasItsContextEnded(t *testing.T) {
	e := newHandOverEnv(t, time.Minute)
	msg := message.NewMessage("a", nil)
	drain(e.clock.read)
	e.offer(t, msg)
	// The offer read the clock (its fence valid), so it sends: the freeze
	// comes now.
	waitClosed(t, e.clock.read, "the offer's look at the clock")
	e.clock.jump(time.Hour)
	got := <-e.out // the offer's timer is a minute away: the send completes
	require.Same(t, msg, got)
	err := got.Context().Err()
	require.Error(t, err, "a handler asking its context must learn that the partition may be another's")
	assert.ErrorIs(t, err, ErrFenced)
	assert.True(t, closed(got.Context().Done()))
	select {
	case <-e.late:
	case <-time.After(patience):
		t.Fatal("the late hand-over was not counted")
	}
	waitClosed(t, e.stopped, "the loop's stop")
}

// A message in a handler's hands has its context ended when the fence
// lapses, and Run waits for its Ack before it returns, while the
// subscription goes on.
func TestAHandledMessageSeesTheLapseAndRunWaitsForItsSettle(t *testing.T) {
	e := newHandOverEnv(t, time.Minute)
	msg := message.NewMessage("a", nil)
	e.offer(t, msg)
	got := <-e.out
	require.NoError(t, got.Context().Err())
	e.fence.Lapse(ErrFenced)
	waitClosed(t, got.Context().Done(), "the handled message's context to end")
	assert.ErrorIs(t, got.Context().Err(), ErrFenced)
}

func TestRunWaitsForTheLastMessagesSettleWhileTheSubscriptionGoesOn(t *testing.T) {
	clock := newFakeClock()
	fence := testFence(clock, clock.Now().Add(time.Minute))
	in, out := make(chan *message.Message, 1), make(chan *message.Message)
	ran := make(chan struct{})
	sub, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer close(ran)
		HandOver{Fence: fence, Out: out, Stop: func() {}}.Run(sub, sub, in)
	}()
	msg := message.NewMessage("a", nil)
	in <- msg
	got := <-out
	close(in) // the loop ended: its message is still in the handler's hands
	select {
	case <-ran:
		t.Fatal("Run returned before the last message was settled")
	case <-time.After(50 * time.Millisecond): // the time in which it must not return: the scenario
	}
	got.Ack()
	waitClosed(t, ran, "Run's return after the Ack")
}

func TestHandOverNacksAnOfferWhenTheLoopEnds(t *testing.T) {
	e := newHandOverEnv(t, time.Minute)
	msg := message.NewMessage("a", nil)
	e.offer(t, msg)
	e.cancel()
	waitClosed(t, msg.Nacked(), "the unsent message's Nack")
	assert.False(t, closed(e.stopped), "the loop is ending anyway")
}
