package loop

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// holdBeat paces a loop's hold on the entries it holds (queued, or in a
// handler's hands): every period the loop resets their idle time (keepHold),
// so that no peer reclaims a live entry. Three beats fit in one
// ClaimMinIdle, so a late one still holds. A failed beat is tried again on
// the next; failing marks the streak, so that it is logged once.
type holdBeat struct {
	timer   *time.Timer
	every   time.Duration
	at      time.Time // when the scheduled beat is due
	failing bool
}

func newHoldBeat(claimMinIdle time.Duration) holdBeat {
	return holdBeat{timer: stoppedTimer(), every: claimMinIdle / 3}
}

// start schedules the next beat one period from now, unless one is
// scheduled already: entries held since then get their hold kept sooner,
// and a beat pushed back on every start might never come.
func (h *holdBeat) start() {
	now := time.Now()
	if h.at.After(now) {
		return
	}
	h.at = now.Add(h.every)
	h.timer.Reset(h.every)
}

// until returns how long from now until the scheduled beat (0 when it is
// due), or -1 when none is scheduled.
func (h *holdBeat) until(now time.Time) time.Duration {
	if h.at.IsZero() {
		return -1
	}
	return max(h.at.Sub(now), 0)
}

// due returns the channel that fires when the held entries need their hold
// kept, or nil when the loop holds nothing.
func (h *holdBeat) due(holding bool) <-chan time.Time {
	if !holding {
		return nil
	}
	return h.timer.C
}

// kept records the end of a beat and schedules the next. It returns true
// when err starts a streak of failures (the one to log).
func (h *holdBeat) kept(err error) (firstFailure bool) {
	h.at = time.Time{}
	h.start()
	if err == nil {
		h.failing = false
		return false
	}
	first := !h.failing
	h.failing = true
	return first
}

// stop stops the timer, for good.
func (h *holdBeat) stop() {
	h.timer.Stop()
	h.at = time.Time{}
}

// keepHold resets the idle time of every entry the loop holds, deferred
// ones included, so that no peer reclaims an entry that is alive here. It
// drops from the queue and the deferred set any entry that is no longer
// pending for this consumer, and any whose body is gone from the stream
// (acknowledged and counted, never delivered). It reports whether the entry
// in flight was found taken over by another consumer.
func (l *Group) keepHold(ctx context.Context) (inFlightTaken bool) {
	ids := l.held.ids()
	held := len(ids)
	ids = append(ids, l.later.ids()...)
	if len(ids) == 0 {
		return false
	}
	if l.acks.len() > 0 {
		// Acked entries wait for their XACK without a hold: send them now.
		l.acks.failed(l.acks.flush(ctx, l.deps.Server))
	}
	counts, err := l.deps.Server.Hold(ctx, ids)
	if l.hold.kept(err) {
		l.deps.Logger.Error("Keeping the hold on held entries failed; retrying on the next beat, peers may reclaim them after ClaimMinIdle",
			err, watermill.LogFields{"entries": len(ids)})
	}
	if err != nil {
		l.deps.Counters.Faults.Add(1)
		return false
	}
	for _, id := range l.later.keep(counts[held:]) {
		l.reportMissing(id, true)
	}
	counts = counts[:held]
	if l.held.inFlight != "" {
		// A message the handler has stays with it either way; an Ack or a
		// Nack settles what is left of it on the server.
		if counts[0] == 0 {
			inFlightTaken = true
			l.deps.Logger.Info("The entry in flight was taken over by another consumer", watermill.LogFields{"entry_id": l.held.inFlight})
		}
		counts = counts[1:]
	}
	l.held.keep(l.admit(l.held.queue, counts))
	return inFlightTaken
}
