package valkeystream

import "time"

// lease paces a group loop's hold on the entries it holds (fetched and not yet
// delivered, or in a handler's hands): every period it resets their idle
// time, so that no peer reclaims a live entry. Three renewals fit in one
// ClaimMinIdle, so a late one still holds. A failed renewal is tried again on
// the next beat; failing marks the streak, so that it is logged once.
type lease struct {
	timer   *time.Timer
	every   time.Duration
	failing bool
}

func newLease(claimMinIdle time.Duration) lease {
	return lease{timer: stoppedTimer(), every: claimMinIdle / 3}
}

// start schedules the next renewal one period from now.
func (ls *lease) start() { ls.timer.Reset(ls.every) }

// due returns the channel that fires when the held entries need renewing, or
// nil when the loop holds nothing.
func (ls *lease) due(holding bool) <-chan time.Time {
	if !holding {
		return nil
	}
	return ls.timer.C
}

// renewed records the end of a renewal and schedules the next. It returns
// true when err starts a streak of failures (the one to log).
func (ls *lease) renewed(err error) (firstFailure bool) {
	ls.start()
	if err == nil {
		ls.failing = false
		return false
	}
	first := !ls.failing
	ls.failing = true
	return first
}

// stop stops the timer, for good.
func (ls *lease) stop() { ls.timer.Stop() }
