package loop

import (
	"strconv"
	"strings"
	"time"
)

// step is what a group loop fetches next.
type step int

const (
	// stepDrain reads the consumer's own pending entries from a cursor
	// (XREADGROUP ... <id>), after a start or a fault.
	stepDrain step = iota + 1
	// stepMissing lists the own pending entries (XPENDING) only to
	// acknowledge those whose bodies are gone (missing bodies), right after a claim reported
	// such entries without their ids (Redis 6.2), before the claimed batch is
	// delivered. Unlike a drain it grows no delivery count.
	stepMissing
	// stepClaim reclaims idle entries of other consumers (XAUTOCLAIM).
	stepClaim
	// stepRead reads new entries (XREADGROUP ... >).
	stepRead
)

// fetchPlan holds a group loop's fetch cursors and decides what it fetches
// next: its own pending entries first, after a start or a fault; idle entries
// of others when the claim beat is due, following XAUTOCLAIM's cursor to the
// end of the pending list; new entries otherwise. It calls the server for
// nothing: the loop runs the step and reports back.
type fetchPlan struct {
	draining    bool   // the own pending list is being drained
	drainFrom   string // cursor of the drain (an id, read after)
	missing     bool   // bodiless entries were claimed; list them before delivering
	missingFrom string // cursor of that listing (an XPENDING range start)
	claimFrom   string // cursor of XAUTOCLAIM
	nextClaim   time.Time
	every       time.Duration // the claim beat; negative: never claim
	// drainBegan is when the last drain began (the start, or a fault).
	drainBegan time.Time
	// drainedTo is the last id the drain delivered: a read of new entries
	// that reached the server before the drain brings nothing above it
	// that the drain did not deliver (see seen).
	drainedTo entryID
}

// newFetchPlan returns the plan of a loop that starts: drain first, and claim
// on the first beat (at once) unless every is negative.
func newFetchPlan(every time.Duration) fetchPlan {
	return fetchPlan{draining: true, drainFrom: "0", claimFrom: "0-0", every: every, drainBegan: time.Now()}
}

// next returns the step to run at now.
func (p *fetchPlan) next(now time.Time) step {
	switch {
	case p.missing:
		return stepMissing
	case p.draining:
		return stepDrain
	case p.every >= 0 && !now.Before(p.nextClaim):
		return stepClaim
	default:
		return stepRead
	}
}

// untilClaim returns how long a loop that holds nothing may wait for new
// entries: until its next claim beat, and at least least; negative (for
// ever) when it never claims.
func (p *fetchPlan) untilClaim(now time.Time, least time.Duration) time.Duration {
	if p.every < 0 {
		return -1
	}
	return max(p.nextClaim.Sub(now), least)
}

// mustFetch reports whether the loop must fetch before it delivers what it
// holds: the listing of missing bodies cannot wait for the queue to empty.
func (p *fetchPlan) mustFetch() bool { return p.missing }

// drained records a drain that returned entries up to last, or nothing
// (last == ""), which ends it.
func (p *fetchPlan) drained(last string) {
	if last != "" {
		p.drainFrom = last
		if id, ok := parseEntryID(last); ok && p.drainedTo.less(id) {
			p.drainedTo = id
		}
		return
	}
	p.drainFrom, p.draining = "0", false
}

// listed records a listing of missing bodies that goes on from next, or that listed everything
// (next == ""), which ends it.
func (p *fetchPlan) listed(next string) {
	if next != "" {
		p.missingFrom = next
		return
	}
	p.missingFrom, p.missing = "", false
}

// claimed records a claim that answered cursor next and reported nulls
// bodiless entries without their ids. A cursor of 0-0 means the pending list
// was scanned to its end: the next claim waits for the next beat; any other
// cursor means more to reclaim first.
func (p *fetchPlan) claimed(next string, nulls int, now time.Time) {
	p.claimFrom = next
	if next == "0-0" {
		p.nextClaim = now.Add(p.every)
	}
	if nulls > 0 {
		p.missing, p.missingFrom = true, "-"
	}
}

// restart makes the loop drain its own pending list again from its start,
// after a fault.
func (p *fetchPlan) restart() {
	p.draining, p.missing, p.drainFrom, p.drainBegan = true, false, "0", time.Now()
}

// seen reports whether the entry id, brought by a read of new entries, is
// one the drain delivered already. Such a read was sent before a fault and
// reached the server before the drain (a read sent ahead, or a shared read
// that read for the subscription while it did not wait): what it took was
// pending for this consumer when the drain read its pending list, so the
// drain delivered it. A read that reached the server after the drain brings
// only ids above every pending one, and so above what the drain delivered.
func (p *fetchPlan) seen(id string) bool {
	if p.drainedTo == (entryID{}) {
		return false // the drain delivered nothing: most loops, all the time
	}
	e, ok := parseEntryID(id)
	return ok && !p.drainedTo.less(e)
}

// entryID is a stream entry id: milliseconds and sequence.
type entryID struct{ ms, seq uint64 }

func (a entryID) less(b entryID) bool { return a.ms < b.ms || (a.ms == b.ms && a.seq < b.seq) }

// parseEntryID reads an id such as "1700000000000-3".
func parseEntryID(s string) (entryID, bool) {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return entryID{}, false
	}
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	return entryID{a, b}, err1 == nil && err2 == nil
}
