package loop

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// acks owns a loop's Acks: the ids a handler Acked that are not sent yet,
// when they are due, and the XACK sent on its own while the loop delivers.
// Every XACK leaves in a Trip: each Ack is taken (take) into the round trip
// that carries it (the next read, a read sent ahead, one of its own, the
// last one when the loop ends), and the reply comes back through landed,
// the one place that counts them, keeps them after a failure and logs it.
//
// An Ack waits at most every (AckFlushInterval) for later ones to share its
// XACK, or less at the handler's pace (see pace); with every negative it is
// due at once. After a failed send the ids are kept, ahead of newer ones,
// and due again after a backoff.
type acks struct {
	ids    []string
	every  time.Duration
	wait   time.Duration // how long an Ack waits: every, or less (see pace)
	timer  *time.Timer   // fires when the oldest id is due
	faults int           // consecutive failed sends

	sending *trip // Acks on their way on their own, while the loop delivers
	again   bool  // Acks came due while sending was on its way

	counters *Counters
	logger   watermill.LoggerAdapter
}

func newAcks(every time.Duration, counters *Counters, logger watermill.LoggerAdapter) acks {
	return acks{every: every, wait: every, timer: stoppedTimer(), counters: counters, logger: logger}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// How long an Ack waits for later ones to share its XACK, besides
// AckFlushInterval, follows the handler's pace: the time it takes to settle
// ackWaitSettles messages, and at least ackWaitMin. A fast handler's Acks
// mostly ride the reads, or share an XACK with many others; a slower one's
// go out every few messages, while it works on the next (the XACK does not
// hold the loop up, see send), so that a crash leaves few handled entries
// unacknowledged, to be handled again.
const (
	ackWaitSettles = 2
	ackWaitMin     = time.Millisecond
)

// pace sets how long an Ack waits from settle, the time the handler takes
// per message (zero: unknown).
func (a *acks) pace(settle time.Duration) {
	a.wait = a.every
	if a.every > 0 && settle > 0 {
		a.wait = min(a.every, max(ackWaitSettles*settle, ackWaitMin))
	}
}

// add keeps id to be sent.
func (a *acks) add(id string) {
	a.ids = append(a.ids, id)
	if len(a.ids) == 1 {
		a.timer.Reset(max(a.wait, 0))
	}
}

// len returns how many ids wait to be sent.
func (a *acks) len() int { return len(a.ids) }

// atOnce reports whether each Ack is to be sent as soon as it is made.
func (a *acks) atOnce() bool { return a.every < 0 }

// due returns the channel that fires when the held ids are due, or nil when
// there are none.
func (a *acks) due() <-chan time.Time {
	if len(a.ids) == 0 {
		return nil
	}
	return a.timer.C
}

// take removes the held ids, for a Trip that carries them: Acks made
// meanwhile start a new batch. Its reply goes to landed.
func (a *acks) take() []string {
	if len(a.ids) == 0 {
		return nil
	}
	ids := a.ids
	a.ids = nil
	a.timer.Stop()
	return ids
}

// landed reads the outcome of the XACK of ids, taken for a round trip whose
// reply r is: on success it counts the entries the server acknowledged; on
// failure it puts ids back, ahead of the ones held now, makes them due
// after a backoff, and returns the error. A caller that handles the error
// as a failed fetch (the fault path counts and logs it) returns it; every
// other caller reports it with failed.
func (a *acks) landed(ids []string, r TripReply) error {
	if len(ids) == 0 {
		return nil
	}
	if r.AckErr == nil {
		a.faults = 0
		a.counters.Acked.Add(r.Acked)
		return nil
	}
	a.ids = append(ids, a.ids...)
	a.faults++
	a.timer.Reset(Backoff(a.faults))
	return fmt.Errorf("acknowledging %d entries: %w", len(ids), r.AckErr)
}

// failed counts a failed XACK that no fetch reports, and logs the first of
// a streak: the one place an Ack's failure is logged.
func (a *acks) failed(err error) {
	if err == nil {
		return
	}
	a.counters.Faults.Add(1)
	if a.faults == 1 {
		a.logger.Error("Acknowledging entries failed; keeping them to send again (if the subscription ends first, they are delivered again)",
			err, watermill.LogFields{"entries": len(a.ids)})
	}
}

// flush sends the held Acks in a round trip of their own, and waits for it.
func (a *acks) flush(ctx context.Context, s Server) error {
	ids := a.take()
	if ids == nil {
		return nil
	}
	return a.landed(ids, s.Send(ctx, Trip{Acks: ids}))
}

// send sends the held Acks in a round trip of their own without waiting for
// the reply (see land). While one is on its way, Acks that come due wait
// for its reply.
func (a *acks) send(ctx context.Context, s Server) {
	switch {
	case a.sending != nil:
		a.again = true
	case len(a.ids) > 0:
		a.sending = startTrip(ctx, s, Trip{Acks: a.take()})
	}
}

// sent returns the channel that is closed when the Acks on their way have
// their reply, or nil.
func (a *acks) sent() <-chan struct{} { return a.sending.doneChan() }

// land waits for the Acks on their way, if any. Acks that came due
// meanwhile are made due at once, unless the send failed (then they wait
// for the backoff, with the failed ones).
func (a *acks) land() {
	t := a.sending
	if t == nil {
		return
	}
	<-t.done
	a.sending = nil
	again := a.again
	a.again = false
	err := a.landed(t.req.Acks, t.reply)
	a.failed(err)
	if err == nil && again && len(a.ids) > 0 {
		a.timer.Reset(0)
	}
}

// stop stops the timer, for good.
func (a *acks) stop() { a.timer.Stop() }

// trip is a round trip sent while the loop goes on. Its goroutine only
// sends it and closes done; the loop reads reply after done is closed.
type trip struct {
	done  chan struct{}
	req   Trip
	reply TripReply
	sent  time.Time
}

// startTrip sends req without waiting for its reply, on a goroutine of its
// own. The round trip is not cancelled when the subscription ends, so that
// the entries it took are known and handed back, and the Acks' outcome
// known; nothing in it blocks, so only a fault makes it last (the client's
// timeouts end it), and the loop waits for its reply only as long as its
// own context, and at its end ExitTimeout, allow.
func startTrip(ctx context.Context, s Server, req Trip) *trip {
	t := &trip{done: make(chan struct{}), req: req, sent: time.Now()}
	rctx := context.WithoutCancel(ctx)
	go func() {
		defer close(t.done)
		t.reply = s.Send(rctx, req)
	}()
	return t
}

// wait waits for t's reply, and reports whether it came before ctx ended.
func (t *trip) wait(ctx context.Context) bool {
	select {
	case <-t.done:
		return true
	case <-ctx.Done():
		select {
		case <-t.done:
			return true
		default:
			return false
		}
	}
}

// doneChan returns the channel that is closed when t has its reply, or nil
// when there is no t.
func (t *trip) doneChan() <-chan struct{} {
	if t == nil {
		return nil
	}
	return t.done
}
