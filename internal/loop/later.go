package loop

import (
	"slices"
	"sync/atomic"
	"time"
)

// later owns a loop's deferred entries: entries whose handler Nacked them
// to come back after a delay of its choosing (valkeystream.RetryAfter),
// while the loop goes on with the next ones. Each stays pending for this
// consumer, held by the hold beat like a queued entry, until it is due;
// then the loop claims it back (which grows its delivery count) and
// delivers it before anything queued. It keeps only the id, the count of
// the Nacked delivery and the due time, at most max of them, and the
// Deferred gauge: how many it keeps, summed over the loops.
type later struct {
	entries []deferredEntry // by due time, earliest first
	max     int
	gauge   *atomic.Int64
}

// deferredEntry is an entry waiting in the deferred set.
type deferredEntry struct {
	id    string
	count int64 // the count of the Nacked delivery, for ClaimBack
	due   time.Time
}

func newLater(most int, gauge *atomic.Int64) later { return later{max: most, gauge: gauge} }

// add keeps the entry id, Nacked on delivery count, until due. It reports
// false when the set is full: the entry is not kept.
func (s *later) add(id string, count int64, due time.Time) bool {
	if len(s.entries) >= s.max {
		return false
	}
	i, _ := slices.BinarySearchFunc(s.entries, due, func(e deferredEntry, t time.Time) int {
		if e.due.After(t) {
			return 1
		}
		return -1 // entries due at the same time keep the order they came in
	})
	s.entries = slices.Insert(s.entries, i, deferredEntry{id: id, count: count, due: due})
	s.gauge.Add(1)
	return true
}

// len returns how many entries are kept.
func (s *later) len() int { return len(s.entries) }

// take removes and returns the earliest entry due at now, if any.
func (s *later) take(now time.Time) (deferredEntry, bool) {
	if len(s.entries) == 0 || s.entries[0].due.After(now) {
		return deferredEntry{}, false
	}
	e := s.entries[0]
	s.entries = slices.Delete(s.entries, 0, 1)
	s.gauge.Add(-1)
	return e, true
}

// until returns how long from now until the earliest entry is due (0 when
// one is due already), or -1 when none is kept.
func (s *later) until(now time.Time) time.Duration {
	if len(s.entries) == 0 {
		return -1
	}
	return max(s.entries[0].due.Sub(now), 0)
}

// ids returns the ids kept, earliest due first: the order of keep's counts.
func (s *later) ids() []string {
	ids := make([]string, len(s.entries))
	for i, e := range s.entries {
		ids[i] = e.id
	}
	return ids
}

// has reports whether id is kept.
func (s *later) has(id string) bool {
	return slices.ContainsFunc(s.entries, func(e deferredEntry) bool { return e.id == id })
}

// keep drops the entries whose count in counts (one per id, in the order of
// ids, as Server.Hold answers) is not positive: another consumer holds it
// (0), or its body is gone (-1). It returns the ids of the ones whose body
// is gone, for the loop to acknowledge.
func (s *later) keep(counts []int64) (missing []string) {
	kept := s.entries[:0]
	for i, e := range s.entries {
		switch {
		case counts[i] > 0:
			kept = append(kept, e)
		case counts[i] < 0:
			missing = append(missing, e.id)
		}
	}
	s.gauge.Add(int64(len(kept) - len(s.entries)))
	clear(s.entries[len(kept):])
	s.entries = kept
	return missing
}

// forget drops id, when another fetch brought it to deliver (a claim after
// its hold lapsed): that delivery replaces the deferred one.
func (s *later) forget(id string) {
	if i := slices.IndexFunc(s.entries, func(e deferredEntry) bool { return e.id == id }); i >= 0 {
		s.entries = slices.Delete(s.entries, i, i+1)
		s.gauge.Add(-1)
	}
}

// leave empties the set and returns its entries to hand back, each with the
// idle time that makes a peer's claim take it when it is due: claimMinIdle
// less the time left, at least 0. An entry due later than claimMinIdle from
// now is taken after claimMinIdle.
func (s *later) leave(now time.Time, claimMinIdle time.Duration) []Later {
	if len(s.entries) == 0 {
		return nil
	}
	back := make([]Later, len(s.entries))
	for i, e := range s.entries {
		back[i] = Later{ID: e.id, Idle: max(claimMinIdle-e.due.Sub(now), 0)}
	}
	s.gauge.Add(-int64(len(s.entries)))
	s.entries = nil
	return back
}
