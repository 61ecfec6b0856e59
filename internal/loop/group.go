package loop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Group is one consumer-group subscription's loop. Only its own goroutine
// (Run) touches it. What it fetches next is its plan's decision (plan.go):
// its own pending entries after a start or a fault, idle entries of other
// consumers on the claim beat, else new entries. It fetches only when
// nothing it fetched is still undelivered and every Ack has been sent (at
// the latest in the same round trip, ahead of a read of new entries), so it
// never claims an entry it is handling; while it holds entries, its hold
// beat keeps peers from reclaiming them (hold.go).
//
// One message's way (docs/design.md, "One message"): readNew or a read
// sent ahead (ahead.go) queues the entry, Run pops it, handle delivers it
// and waits for the handler (deliver.go), the Ack goes to the Ack owner
// (acks.go), and its XACK leaves through Server.Send (redis.go) in the next
// round trip.
type Group struct {
	cfg  Config
	deps Deps
	out  chan *message.Message

	held    held
	plan    fetchPlan
	pre     prefetch
	acks    acks
	ahead   ahead
	hold    holdBeat
	later   later
	nackLog logLimit
	retries retries
}

// entry is one stream entry on its way to the handler.
type entry struct {
	id     string
	fields map[string]any // nil when the body is gone from the stream
	count  int64          // the server's delivery count

	// The message decoded ahead of its delivery (see Group.decodeNext).
	decoded   bool
	msg       *message.Message
	decodeErr error
}

// held owns what a loop holds on the server: the entries fetched and not
// yet delivered, in stream order; the one in flight (being handed over, in
// a handler's hands, or waiting to be delivered again after a Nack); and
// the ones to hand back when the loop ends, which no handler has. It keeps
// the ReadAhead gauge: the queue's length, summed over the loops.
type held struct {
	queue []entry
	// spare is the queue's array as of its last growth: push queues into
	// it again once the queue is empty, so that a loop in a steady pace of
	// reads queues without allocating.
	spare    []entry
	inFlight string // id of the entry in flight, or ""
	giveBack []string
	gauge    *atomic.Int64
}

// push queues es after what is queued.
func (h *held) push(es ...entry) {
	if len(h.queue) == 0 {
		h.queue = h.spare[:0] // pop cleared what it took
	}
	size := cap(h.queue)
	h.queue = append(h.queue, es...)
	if cap(h.queue) != size { // a new array, the queue at its start
		h.spare = h.queue[:0]
	}
	h.gauge.Add(int64(len(es)))
}

// pop takes the first queued entry.
func (h *held) pop() entry {
	e := h.queue[0]
	h.queue[0] = entry{}
	h.queue = h.queue[1:]
	h.gauge.Add(-1)
	return e
}

// keep replaces the queue with kept, the entries of it still this
// consumer's (in order).
func (h *held) keep(kept []entry) {
	h.gauge.Add(int64(len(kept) - len(h.queue)))
	h.queue = kept
}

// holding reports whether the loop holds any entry.
func (h *held) holding() bool { return h.inFlight != "" || len(h.queue) > 0 }

// ids returns the ids of the entries held: the one in flight first, if any,
// then the queue's.
func (h *held) ids() []string {
	ids := make([]string, 0, len(h.queue)+1)
	if h.inFlight != "" {
		ids = append(ids, h.inFlight)
	}
	for _, e := range h.queue {
		ids = append(ids, e.id)
	}
	return ids
}

// handBack keeps ids to hand back when the loop ends.
func (h *held) handBack(ids ...string) { h.giveBack = append(h.giveBack, ids...) }

// leave empties the queue and returns every id to hand back: the ones kept
// for it, then the queue's.
func (h *held) leave() []string {
	for _, e := range h.queue {
		h.giveBack = append(h.giveBack, e.id)
	}
	h.gauge.Add(-int64(len(h.queue)))
	h.queue, h.spare = nil, nil
	ids := h.giveBack
	h.giveBack = nil
	return ids
}

// NewGroup returns the loop of a group subscription that sends its messages
// to out, which Run closes when it ends.
func NewGroup(cfg Config, deps Deps, out chan *message.Message) *Group {
	return &Group{
		cfg:     cfg,
		deps:    deps,
		out:     out,
		held:    held{gauge: &deps.Counters.ReadAhead},
		plan:    newFetchPlan(cfg.ClaimInterval),
		pre:     newPrefetch(cfg.BatchSize, cfg.PrefetchWindow, cfg.ReadAheadBytes),
		acks:    newAcks(cfg.AckFlushInterval, deps.Counters, deps.Logger),
		hold:    newHoldBeat(cfg.ClaimMinIdle),
		later:   newLater(int(cfg.BatchSize), &deps.Counters.Nacks.Deferred),
		nackLog: logLimit{every: nackLogEvery},
		retries: retries{faults: deps.Counters, logger: deps.Logger, health: deps.Health, failover: deps.Server.Failed},
	}
}

// Run delivers until ctx ends, or until it cannot go on, then sends the Acks
// not sent yet, hands back what no handler has, releases the consumer name
// and closes the channel.
func (l *Group) Run(ctx context.Context) {
	defer close(l.out)
	defer func() {
		if l.deps.Release != nil {
			l.deps.Release()
		}
	}()
	defer l.leave()
	// Interrupt ends a blocked read once ctx ends; it runs once, and the
	// call here returns when the one for ctx, if any, has finished.
	stop := context.AfterFunc(ctx, l.deps.Server.Interrupt)
	defer func() {
		stop()
		l.deps.Server.Interrupt()
	}()
	// The parent of message contexts: a message's context ends when it is
	// settled, or when CloseGrace has passed after the subscription ended.
	msgBase := context.WithoutCancel(ctx)
	counters := l.deps.Counters
	for ctx.Err() == nil {
		if l.later.len() > 0 && l.hold.until(time.Now()) == 0 {
			// Between waits (a read was cut short for it, see untilDue):
			// the deferred entries' hold is due.
			l.keepHold(ctx)
		}
		if d, ok := l.dueLater(); ok {
			// A deferred entry is due: it goes before anything queued.
			if !l.comeBack(ctx, msgBase, d) {
				return
			}
			continue
		}
		if len(l.held.queue) == 0 || l.plan.mustFetch() {
			if err := l.fetch(ctx); err != nil {
				if ctx.Err() != nil || !l.fault(ctx, "fetching entries", err) {
					return
				}
				continue
			}
			l.retries.succeeded()
			continue
		}
		e := l.held.pop()
		l.readAhead(ctx)
		counters.InFlight.Add(1)
		ok := l.handle(ctx, msgBase, e)
		counters.InFlight.Add(-1)
		if !ok {
			return
		}
	}
}

// dueLater takes the deferred entry due now, if any, unless the plan must
// fetch first.
func (l *Group) dueLater() (deferredEntry, bool) {
	if l.plan.mustFetch() {
		return deferredEntry{}, false
	}
	return l.later.take(time.Now())
}

// fetch runs the step the plan names. Acks waiting to be sent go first, so
// that no step reads an entry this loop has handled. A read sent ahead
// lands first, and is the fetch: the loop comes back for the next step if
// it brought nothing.
func (l *Group) fetch(ctx context.Context) error {
	for _, t := range []*trip{l.acks.sending, l.ahead.trip} {
		if t != nil && !t.wait(ctx) {
			return ctx.Err() // ending: leave lands them, within ExitTimeout
		}
	}
	l.acks.land()
	if l.ahead.trip != nil || l.ahead.err != nil {
		err := errors.Join(l.ahead.err, l.landAhead())
		l.ahead.err = nil
		return err
	}
	l.inherit()
	var err error
	switch l.plan.next(time.Now()) {
	case stepDrain:
		if err = l.acks.flush(ctx, l.deps.Server); err == nil {
			err = l.drain(ctx)
		}
	case stepMissing:
		err = l.ackMissing(ctx)
	case stepClaim:
		if err = l.acks.flush(ctx, l.deps.Server); err == nil {
			err = l.claim(ctx)
		}
	case stepRead:
		err = l.readNew(ctx)
	}
	if len(l.held.queue) > 0 {
		l.hold.start()
	}
	return err
}

// inherit makes the loop drain its own pending list again, from its start,
// when entries of another name were moved to its consumer (see
// Inheritance). Only with nothing queued, as after a fault: what a drain
// brings is then nothing the loop holds, and every Ack of what it handled
// is sent before the drain reads. Else the move waits for the next fetch.
func (l *Group) inherit() {
	if l.deps.Inherit == nil || len(l.held.queue) > 0 || l.plan.missing {
		return
	}
	select {
	case <-l.deps.Inherit.Moved():
		l.plan.restart()
		l.deps.Logger.Debug("Entries of another consumer name were moved to this one; draining the own pending list again", nil)
	default:
	}
}

// drain reads the next batch of this consumer's own pending entries from
// the plan's drain cursor, and advances the cursor.
func (l *Group) drain(ctx context.Context) error {
	es, err := l.deps.Server.ReadOwn(ctx, l.plan.drainFrom, l.pre.batch())
	if err != nil {
		return fmt.Errorf("draining own pending entries: %w", err)
	}
	last := ""
	if len(es) > 0 {
		last = es[len(es)-1].ID
	}
	l.plan.drained(last)
	// Deferred entries are pending here too: they stay deferred until due.
	es = slices.DeleteFunc(es, func(e Entry) bool { return l.later.has(e.ID) })
	if len(es) == 0 {
		return nil
	}
	n, err := l.enqueueWithCounts(ctx, es)
	if err != nil {
		return fmt.Errorf("reading delivery counts of drained entries: %w", err)
	}
	l.deps.Counters.Drained.Add(int64(n))
	l.deps.Logger.Debug("Drained own pending entries", watermill.LogFields{"entries": len(es)})
	return nil
}

// ackMissing acknowledges the own pending entries whose bodies are gone,
// which a claim reported as nulls without their ids (Redis 6.2): they are
// pending for this consumer now. It lists the pending entries and asks the
// hold call which bodies are gone, so no delivery count grows; the entries
// with bodies are the claimed batch, queued already.
func (l *Group) ackMissing(ctx context.Context) error {
	ids, err := l.deps.Server.ListOwn(ctx, l.plan.missingFrom, l.cfg.BatchSize)
	if err != nil {
		return fmt.Errorf("listing own pending entries: %w", err)
	}
	if len(ids) == 0 {
		l.plan.listed("")
		return nil
	}
	counts, err := l.deps.Server.Hold(ctx, ids)
	if err != nil {
		return fmt.Errorf("listing own pending entries: %w", err)
	}
	for i, n := range counts {
		if n < 0 {
			l.reportMissing(ids[i], true)
		}
	}
	l.plan.listed("(" + ids[len(ids)-1])
	return nil
}

// claim reclaims idle entries of other consumers.
func (l *Group) claim(ctx context.Context) error {
	c, err := l.deps.Server.Claim(ctx, l.plan.claimFrom, l.pre.batch())
	if err != nil {
		return fmt.Errorf("reclaiming idle entries: %w", err)
	}
	l.plan.claimed(c.Next, c.Nulls, time.Now())
	if c.Next == "0-0" && l.deps.Prune != nil {
		// The pending list was scanned to its end: a good time to remove
		// consumers that left with nothing pending.
		l.deps.Prune(ctx)
	}
	for _, id := range c.Deleted {
		// The server already dropped these from the pending list.
		l.reportMissing(id, false)
	}
	if len(c.Entries) == 0 {
		return nil
	}
	n, err := l.enqueueWithCounts(ctx, c.Entries)
	if err != nil {
		return fmt.Errorf("reading delivery counts of reclaimed entries: %w", err)
	}
	l.deps.Counters.Reclaimed.Add(int64(n))
	l.deps.Logger.Info("Reclaimed idle entries", watermill.LogFields{"entries": len(c.Entries)})
	return nil
}

// readNew reads new entries. Acks waiting to be sent go in the same round
// trip as a read that does not block, which under load brings the next batch
// at once; only when that finds nothing does a blocking read follow.
func (l *Group) readNew(ctx context.Context) error {
	l.ahead.more = false
	shared := l.deps.Shared
	if shared != nil && shared.Covers() {
		// Its shared reader reads this stream already: the Acks go on their
		// own, and the wait takes what it read.
		l.acks.send(ctx, l.deps.Server)
		return l.readShared(ctx)
	}
	count := l.pre.count()
	if l.acks.len() > 0 {
		ids := l.acks.take()
		sent := time.Now()
		r := l.deps.Server.Send(ctx, Trip{Acks: ids, Reads: []int64{count}})
		l.ahead.measure(time.Since(sent))
		if err := l.acks.landed(ids, r); err != nil {
			// A fault like a failed read: the entries this read brought, if
			// any, are pending for this consumer and come back with the
			// drain that follows.
			return err
		}
		if r.ReadErr != nil {
			return fmt.Errorf("reading new entries: %w", r.ReadErr)
		}
		if n := l.enqueueNew(r.Entries); n > 0 {
			l.ahead.more = r.Full
			return nil
		}
	}
	if shared != nil {
		return l.readShared(ctx)
	}
	block, ok := l.untilDue(l.cfg.BlockTime)
	if !ok {
		return nil // a deferred entry is due
	}
	sent := time.Now()
	es, err := l.deps.Server.Block(ctx, count, block)
	if err != nil {
		return fmt.Errorf("reading new entries: %w", err)
	}
	if int64(l.enqueueNew(es)) == count {
		// A full read did not wait for entries: its time is a round trip,
		// and more entries may wait.
		l.ahead.measure(time.Since(sent))
		l.ahead.more = true
	}
	return nil
}

// readShared waits for new entries with the loop's shared reader and
// queues them.
func (l *Group) readShared(ctx context.Context) error {
	wait := l.plan.untilClaim(time.Now(), l.cfg.BlockTime)
	if l.deps.Inherit != nil && l.deps.Inherit.Watching() {
		wait = l.cfg.BlockTime // come back soon for what is moved (see inherit)
	}
	d, ok := l.untilDue(wait)
	if !ok {
		return nil // a deferred entry is due
	}
	w, err := l.deps.Shared.Wait(ctx, l.pre.count(), d)
	if err != nil {
		return fmt.Errorf("reading new entries: %w", err)
	}
	l.ahead.more = w.Full
	es := w.Entries
	if !w.Since.IsZero() && w.Since.Before(l.plan.drainBegan) {
		// Read for this loop while it did not wait, by a read sent before
		// its last drain began.
		var err error
		if es, err = l.undrained(ctx, es); err != nil {
			return fmt.Errorf("checking entries read before a drain: %w", err)
		}
	}
	if !w.Since.IsZero() && time.Since(w.Since) >= l.cfg.ClaimMinIdle/2 {
		// Read long enough ago that a claim, a peer's or this loop's own,
		// may have taken them: check that they are still this consumer's,
		// and not delivered again since.
		if es := l.unseen(es); len(es) == 0 {
			return nil
		} else if err := l.enqueueParked(ctx, es); err != nil {
			return fmt.Errorf("reading delivery counts of entries read ahead: %w", err)
		}
		return nil
	}
	l.enqueueNew(es)
	return nil
}

// untilDue bounds a wait for new entries of d (for ever when negative) by
// the time until the next deferred entry is due, or their hold beat is,
// rounded up to the millisecond (a BLOCK's unit), and reports false when
// one is due already: the loop does it instead of waiting. (Only deferred
// entries are held while the loop waits for new ones.)
func (l *Group) untilDue(d time.Duration) (time.Duration, bool) {
	now := time.Now()
	u := l.later.until(now)
	if u < 0 {
		return d, true
	}
	if h := l.hold.until(now); h >= 0 {
		u = min(u, h)
	}
	u = (u + time.Millisecond - 1).Truncate(time.Millisecond)
	if u == 0 {
		return 0, false
	}
	if d < 0 {
		return u, true
	}
	return min(d, u), true
}

// enqueueNew queues the entries of a read of new entries and returns how
// many it read. An entry that the drain delivered already (the read reached
// the server before it, see fetchPlan.seen) is not queued again. An entry
// the read claimed (Redis 8.4's XREADGROUP ... CLAIM) comes with its
// delivery count and is counted as reclaimed; every other one is a first
// delivery.
func (l *Group) enqueueNew(es []Entry) int {
	claimed := 0
	for _, m := range l.unseen(es) {
		count := m.Count
		if count > 1 {
			claimed++
		} else {
			count = 1 // a first delivery: the server's count is 1 by definition
		}
		l.held.push(entry{id: m.ID, fields: m.Fields, count: count})
		l.later.forget(m.ID) // claimed inside the read: this delivery replaces the deferred one
		l.pre.read(m.Fields)
	}
	if claimed > 0 {
		l.deps.Counters.Reclaimed.Add(int64(claimed))
		l.deps.Logger.Info("Reclaimed idle entries in a read", watermill.LogFields{"entries": claimed})
	}
	return len(es)
}

// unseen returns es without the entries the drain delivered already (see
// fetchPlan.seen). An entry the read claimed is kept whatever its id: a
// read is sent after the drain (or, shared, while the loop waits, see
// readShared), so what it claimed was not in the pending list the drain
// read.
func (l *Group) unseen(es []Entry) []Entry {
	return l.dropSeen(es, func(e Entry) bool { return e.Count <= 1 && l.plan.seen(e.ID) })
}

// undrained returns the entries of es, read by a read sent before the
// loop's last drain began, that the drain did not deliver. A new entry it
// took was pending for this consumer when the drain read its pending list,
// so the drain delivered it if the drain went that far (fetchPlan.seen). A
// claimed one may have been claimed before or after the drain read that
// far (a blocked read claims when it is woken): the server's count tells,
// as the drain grew it if it delivered it; one whose count is still the
// claim's is kept, one taken by another consumer meanwhile is dropped.
func (l *Group) undrained(ctx context.Context, es []Entry) ([]Entry, error) {
	var claimed []string
	for _, e := range es {
		if e.Count > 1 {
			claimed = append(claimed, e.ID)
		}
	}
	var counts []int64
	if len(claimed) > 0 {
		var err error
		if counts, err = l.deps.Server.Hold(ctx, claimed); err != nil {
			return nil, err
		}
	}
	now := make(map[string]int64, len(claimed))
	for i, id := range claimed {
		now[id] = counts[i]
	}
	return l.dropSeen(es, func(e Entry) bool {
		if e.Count > 1 {
			return now[e.ID] != e.Count
		}
		return l.plan.seen(e.ID)
	}), nil
}

// dropSeen returns es without the entries seen reports, logging each.
func (l *Group) dropSeen(es []Entry, seen func(Entry) bool) []Entry {
	var kept []Entry // nil while nothing was dropped
	for i, e := range es {
		if !seen(e) {
			if kept != nil {
				kept = append(kept, e)
			}
			continue
		}
		if kept == nil {
			kept = append(make([]Entry, 0, len(es)), es[:i]...)
		}
		l.deps.Logger.Debug("A read sent before the drain brought an entry the drain delivered; not delivering it again",
			watermill.LogFields{"entry_id": e.ID})
	}
	if kept == nil {
		return es
	}
	return kept
}

// enqueueParked queues entries that a shared read parked for the loop long
// enough ago that they may have been claimed since: those still this
// consumer's, with the server's counts, less those whose count grew past
// the one they were read with. A count grows only with a delivery: a claim
// took the entry while it waited parked (idle for ClaimMinIdle) and
// delivered it, this loop's own claim beat when the entry is still its own,
// so the parked copy is not delivered a second time.
func (l *Group) enqueueParked(ctx context.Context, es []Entry) error {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	counts, err := l.deps.Server.Hold(ctx, ids)
	if err != nil {
		return err
	}
	entries := make([]entry, 0, len(es))
	kept := counts[:0]
	for i, e := range es {
		if read := max(e.Count, 1); counts[i] > read {
			l.deps.Logger.Debug("An entry a shared read parked was delivered again by a claim since; not delivering the parked copy",
				watermill.LogFields{"entry_id": e.ID, "read_count": read, "delivery_count": counts[i]})
			continue
		}
		l.pre.read(e.Fields)
		entries = append(entries, entry{id: e.ID, fields: e.Fields})
		kept = append(kept, counts[i])
	}
	queued := l.admit(entries, kept)
	l.queueHeld(queued)
	// Those the read claimed (Redis 8.4's XREADGROUP ... CLAIM) count as
	// reclaimed, as they do when they are not parked (see enqueueNew): an
	// entry queued here still has the count it was read with, above 1 only
	// if the read claimed it.
	n := 0
	for _, e := range queued {
		if e.count > 1 {
			n++
		}
	}
	if n > 0 {
		l.deps.Counters.Reclaimed.Add(int64(n))
		l.deps.Logger.Info("Reclaimed idle entries in a read", watermill.LogFields{"entries": n})
	}
	return nil
}

// enqueueWithCounts queues es, just read or claimed, with their delivery
// counts from the pending list (see admit). It returns how many were queued.
func (l *Group) enqueueWithCounts(ctx context.Context, es []Entry) (int, error) {
	entries := make([]entry, len(es))
	ids := make([]string, len(es))
	for i, m := range es {
		entries[i] = entry{id: m.ID, fields: m.Fields}
		ids[i] = m.ID
		l.pre.read(m.Fields)
	}
	counts, err := l.deps.Server.Hold(ctx, ids)
	if err != nil {
		return 0, err
	}
	kept := l.admit(entries, counts)
	l.queueHeld(kept)
	return len(kept), nil
}

// queueHeld queues entries that Server.Hold found pending for this
// consumer.
func (l *Group) queueHeld(kept []entry) {
	l.held.push(kept...)
	for _, e := range kept {
		l.later.forget(e.id) // claimed after its hold lapsed: this delivery replaces the deferred one
	}
}

// admit returns the entries that are pending for this consumer, with the
// server's counts (as Server.Hold reports them). An entry whose body is
// gone is acknowledged and counted, never delivered; one that another
// consumer holds now is left to it.
func (l *Group) admit(entries []entry, counts []int64) []entry {
	kept := entries[:0]
	for i, e := range entries {
		switch {
		case counts[i] == 0:
			// Another consumer holds it now.
		case counts[i] < 0 || e.fields == nil:
			l.reportMissing(e.id, true)
		default:
			e.count = counts[i]
			kept = append(kept, e)
		}
	}
	clear(entries[len(kept):]) // no message stays behind in the array
	return kept
}

// reportMissing handles a pending entry whose body was trimmed or deleted: it
// is acknowledged (when still pending) and counted, never delivered.
func (l *Group) reportMissing(id string, stillPending bool) {
	if stillPending {
		l.acks.add(id)
	}
	l.deps.Counters.MissingBodies.Add(1)
	l.deps.Logger.Error("Pending entry was trimmed or deleted from the stream before it was handled; acknowledged without delivery",
		nil, watermill.LogFields{"entry_id": id})
}

// leave sends the Acks not sent yet and hands back the entries the loop
// holds and no handler has, in one round trip, when the loop ends. It waits
// ExitTimeout at most, for the round trips still on their way and its own
// together: Acks that do not reach the server mean redeliveries, and
// entries not handed back are reclaimed after ClaimMinIdle, never lost.
func (l *Group) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), ExitTimeout)
	defer cancel()
	landed := l.tripsLanded(ctx)
	if landed {
		l.acks.land()
		l.landAheadOnExit()
	}
	l.acks.stop()
	l.hold.stop()
	if l.deps.Shared != nil {
		l.held.handBack(l.deps.Shared.Leave()...)
	}
	back := l.held.leave()
	deferred := l.later.leave(time.Now(), l.cfg.ClaimMinIdle)
	if !landed {
		l.deps.Counters.Faults.Add(1)
		l.deps.Logger.Error("Round trips on their way did not come back as the subscription ended; their Acks may not have reached the server (those entries are delivered again), and entries they read come back after ClaimMinIdle",
			ctx.Err(), watermill.LogFields{"entries_to_hand_back": len(back), "acks_not_sent": l.acks.len()})
	}
	ids := l.acks.take()
	if len(ids) == 0 && len(back) == 0 && len(deferred) == 0 {
		return
	}
	r := l.deps.Server.Send(ctx, Trip{Acks: ids, HandBack: back, Later: deferred, Last: true})
	l.acks.failed(l.acks.landed(ids, r))
	if len(back) == 0 && len(deferred) == 0 {
		return
	}
	fields := watermill.LogFields{"entries": len(back), "deferred_entries": len(deferred)}
	if r.BackErr != nil {
		l.deps.Counters.Faults.Add(1)
		l.deps.Logger.Error("Handing back entries no handler has failed; peers reclaim them after ClaimMinIdle",
			r.BackErr, fields)
		return
	}
	l.deps.Logger.Debug("Handed back entries no handler has, and the deferred ones for when they are due", fields)
}

// tripsLanded waits until the round trips on their way, if any, have their
// replies, and reports whether they had them before ctx ended.
func (l *Group) tripsLanded(ctx context.Context) bool {
	for _, done := range []<-chan struct{}{l.acks.sent(), l.ahead.trip.doneChan()} {
		if done == nil {
			continue
		}
		select {
		case <-done:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// ExitTimeout bounds how long a subscription that ends waits for its round
// trips on their way and its last one (its Acks, and its entries handed
// back) to reach the server; the release of its consumer name gets 200 ms
// after it (internal/lease), and a call in progress when the subscription
// ended 200 ms before it (bounded.Grace), so that Close ends in about
// CloseGrace plus a second even when the network is cut.
const ExitTimeout = 600 * time.Millisecond

// fault handles a failed call: it re-runs the group door when the group or
// the stream vanished, backs off, and makes the loop drain its own pending
// list again before it reads anything new. It returns false when ctx ended
// during the backoff.
func (l *Group) fault(ctx context.Context, what string, err error) bool {
	l.plan.restart()
	if isNoGroup(err) && l.deps.Reopen != nil {
		l.deps.Logger.Error("Consumer group or stream vanished; creating it again", err, nil)
		if derr := l.deps.Reopen(ctx); derr != nil {
			err = derr
		}
	}
	return l.retries.fail(ctx, what, err, l.pause)
}
