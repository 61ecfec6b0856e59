package valkeystream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// entry is one stream entry on its way to the handler.
type entry struct {
	id     string
	fields map[string]any // nil when the body is gone from the stream
	count  int64          // the server's delivery count

	// The message decoded ahead of its delivery (see handedOver).
	decoded   bool
	msg       *message.Message
	decodeErr error
}

// groupLoop is one consumer-group subscription. Only its own goroutine
// touches it. What it fetches next is its plan's decision (fetchPlan): its own
// pending entries after a start or a fault, idle entries of other consumers
// on the claim beat, else new entries. It fetches only when nothing it
// fetched is still undelivered and every Ack has been sent (at the latest in
// the same round trip, ahead of a read of new entries), so it never claims
// an entry it is handling; while it holds entries, its lease renews its hold
// on them so that no peer reclaims them from under it.
//
// One message's way: readNew queues the entry, run pops it, handle decodes
// and delivers it and waits for the handler (deliver), the Ack goes into the
// ack batch, and the batch's XACK goes in the same round trip as the next
// read (readNew or readAhead) or on its own when it is due first (sendAcks,
// whose reply the loop does not wait for).
type groupLoop struct {
	sub      *Subscriber
	cfg      *SubscriberConfig
	client   redis.UniversalClient
	reader   blockingReader // for the blocking read of new entries
	shared   *sharedReader  // waits for new entries with others instead; nil: reads on its own
	key      string
	group    string
	consumer string
	out      chan *message.Message
	logger   watermill.LoggerAdapter

	queue    []entry  // fetched, not yet delivered, in order
	inFlight string   // id of the entry being delivered or in a handler's hands, or ""
	giveBack []string // ids to hand back when the loop ends: no handler has them

	plan     fetchPlan
	prefetch prefetch
	acks     ackBatch
	lease    lease
	retries  retries
	nackLog  logLimit

	ahead    *asyncTrip    // reads of new entries on their way while the loop delivers (overlap.go)
	sending  *asyncTrip    // Acks on their way while the loop delivers (overlap.go)
	ackDue   bool          // Acks came due while sending was on its way
	aheadErr error         // how the last such read failed, to handle once the queue is empty
	readRTT  time.Duration // moving average of a non-blocking read's round trip
	more     bool          // the last read of new entries got all it asked for: more may wait

	sweeper     *sweeper // removes departed consumers on the claim beat
	releaseName func()   // releases the consumer name's lease; called on exit
}

func newGroupLoop(s *Subscriber, key, consumer string, out chan *message.Message, logger watermill.LoggerAdapter) *groupLoop {
	l := &groupLoop{
		sub:      s,
		cfg:      &s.config,
		client:   s.config.Client,
		reader:   newBlockingReader(s.config.Client),
		key:      key,
		group:    s.config.ConsumerGroup,
		consumer: consumer,
		out:      out,
		logger:   logger,
		plan:     newFetchPlan(s.config.ClaimInterval),
		prefetch: newPrefetch(s.config.BatchSize, s.config.PrefetchWindow, s.config.ReadAheadBytes),
		acks:     newAckBatch(s.config.AckFlushInterval),
		lease:    newLease(s.config.ClaimMinIdle),
		retries:  retries{sub: s, logger: logger},
		nackLog:  logLimit{every: nackLogEvery},
	}
	if l.reader.own {
		l.retries.reader = l.reader.client
	}
	return l
}

// nackLogEvery bounds how often a subscription logs Nacks at Info level.
const nackLogEvery = 10 * time.Second

func (l *groupLoop) run(ctx context.Context) {
	defer close(l.out)
	defer l.releaseName()
	defer l.flushOnExit()
	defer l.leaveShared()
	defer l.reader.interruptOn(ctx)()
	// The parent of message contexts: a message's context ends when it is
	// settled, or when CloseGrace has passed after the subscription ended.
	msgBase := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		if len(l.queue) == 0 || l.plan.mustFetch() {
			if err := l.fetch(ctx); err != nil {
				if ctx.Err() != nil || !l.fault(ctx, "fetching entries", err) {
					return
				}
				continue
			}
			l.retries.succeeded()
			continue
		}
		e := l.queue[0]
		l.queue = l.queue[1:]
		l.sub.stats.readAhead.Add(-1)
		l.readAhead(ctx)
		l.sub.stats.inFlight.Add(1)
		ok := l.handle(ctx, msgBase, e)
		l.sub.stats.inFlight.Add(-1)
		if !ok {
			return
		}
	}
}

// fetch runs the step the plan names. Acks waiting to be sent go first, so
// that no step reads an entry this loop has handled. A read sent ahead
// (overlap.go) lands first, and is the fetch: the loop comes back for the
// next step if it brought nothing.
func (l *groupLoop) fetch(ctx context.Context) error {
	l.landAcks()
	if l.ahead != nil || l.aheadErr != nil {
		err := errors.Join(l.aheadErr, l.landAhead())
		l.aheadErr = nil
		return err
	}
	var err error
	switch l.plan.next(time.Now()) {
	case stepDrain:
		if err = l.flushAcks(ctx); err == nil {
			err = l.drain(ctx)
		}
	case stepSweep:
		err = l.sweep(ctx)
	case stepClaim:
		if err = l.flushAcks(ctx); err == nil {
			err = l.claim(ctx)
		}
	case stepRead:
		err = l.readNew(ctx)
	}
	if len(l.queue) > 0 {
		l.lease.start()
	}
	return err
}

// readOwn reads the next batch of this consumer's own pending entries from
// the plan's drain cursor, and advances the cursor.
func (l *groupLoop) readOwn(ctx context.Context) ([]redis.XMessage, error) {
	streams, err := l.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    l.group,
		Consumer: l.consumer,
		Streams:  []string{l.key, l.plan.drainFrom},
		Count:    l.prefetch.batch(),
		Block:    -1,
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var msgs []redis.XMessage
	if len(streams) > 0 {
		msgs = streams[0].Messages
	}
	last := ""
	if len(msgs) > 0 {
		last = msgs[len(msgs)-1].ID
	}
	l.plan.drained(last)
	return msgs, nil
}

func (l *groupLoop) drain(ctx context.Context) error {
	msgs, err := l.readOwn(ctx)
	if err != nil {
		return fmt.Errorf("draining own pending entries: %w", err)
	}
	if len(msgs) == 0 {
		return nil
	}
	n, err := l.enqueueWithCounts(ctx, msgs)
	if err != nil {
		return fmt.Errorf("reading delivery counts of drained entries: %w", err)
	}
	l.sub.stats.drained.Add(int64(n))
	l.logger.Debug("Drained own pending entries", watermill.LogFields{"entries": len(msgs)})
	return nil
}

// sweep acknowledges the own pending entries whose bodies are gone, which a
// claim reported as nulls without their ids (Redis 6.2): they are pending for
// this consumer now. It lists the pending entries with XPENDING and asks the
// renewal script which bodies are gone, so no delivery count grows; the
// entries with bodies are the claimed batch, queued already.
func (l *groupLoop) sweep(ctx context.Context) error {
	pending, err := l.client.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: l.key, Group: l.group, Consumer: l.consumer,
		Start: l.plan.sweepFrom, End: "+", Count: l.cfg.BatchSize,
	}).Result()
	if err != nil {
		return fmt.Errorf("sweeping own pending entries: %w", err)
	}
	if len(pending) == 0 {
		l.plan.swept("")
		return nil
	}
	ids := make([]string, len(pending))
	for i, p := range pending {
		ids[i] = p.ID
	}
	counts, err := l.hold(ctx, ids)
	if err != nil {
		return fmt.Errorf("sweeping own pending entries: %w", err)
	}
	for i, n := range counts {
		if n < 0 {
			l.reportMissing(ids[i], true)
		}
	}
	l.plan.swept("(" + ids[len(ids)-1])
	return nil
}

func (l *groupLoop) claim(ctx context.Context) error {
	reply, err := l.client.Do(ctx, "XAUTOCLAIM", l.key, l.group, l.consumer,
		l.cfg.ClaimMinIdle.Milliseconds(), l.plan.claimFrom, "COUNT", l.prefetch.batch()).Slice()
	if err != nil {
		return fmt.Errorf("reclaiming idle entries: %w", err)
	}
	next, msgs, deleted, nulls, err := parseAutoClaim(reply)
	if err != nil {
		return fmt.Errorf("reclaiming idle entries: %w", err)
	}
	l.plan.claimed(next, nulls, time.Now())
	if next == "0-0" {
		// The pending list was scanned to its end: a good time to remove
		// consumers that left with nothing pending.
		l.sweeper.sweep(ctx)
	}
	for _, id := range deleted {
		// The server already dropped these from the pending list.
		l.reportMissing(id, false)
	}
	if len(msgs) == 0 {
		return nil
	}
	n, err := l.enqueueWithCounts(ctx, msgs)
	if err != nil {
		return fmt.Errorf("reading delivery counts of reclaimed entries: %w", err)
	}
	l.sub.stats.reclaimed.Add(int64(n))
	l.logger.Info("Reclaimed idle entries", watermill.LogFields{"entries": len(msgs)})
	return nil
}

// readNew reads new entries. Acks waiting to be sent go in the same round
// trip as a read that does not block, which under load brings the next batch
// at once; only when that finds nothing does a blocking read follow.
func (l *groupLoop) readNew(ctx context.Context) error {
	l.more = false
	if l.shared != nil && l.shared.covers(l.key) {
		// Its shared reader reads this stream already (sharedread.go): the
		// Acks go on their own, and the wait takes what it parked.
		l.sendAcks(ctx)
		return l.readShared(ctx)
	}
	if l.acks.len() > 0 {
		args := l.readArgs(-1)
		pipe := l.client.Pipeline()
		ack := l.acks.send(ctx, pipe, l.key, l.group)
		read := pipe.XReadGroup(ctx, args)
		sent := time.Now()
		_, _ = pipe.Exec(ctx) // each command carries its own error
		l.measureRead(time.Since(sent))
		streams, err := read.Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		if ackErr := l.settleAcks(ack); ackErr != nil {
			// A fault like a failed read: the entries this read brought, if
			// any, are pending for this consumer and come back with the
			// drain that follows.
			return ackErr
		}
		if err != nil {
			return fmt.Errorf("reading new entries: %w", err)
		}
		if n := l.enqueueNew(streams); n > 0 {
			l.more = int64(n) == args.Count
			return nil
		}
	}
	if l.shared != nil {
		return l.readShared(ctx) // see sharedread.go
	}
	args := l.readArgs(l.cfg.BlockTime)
	sent := time.Now()
	streams, err := l.reader.client.XReadGroup(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading new entries: %w", err)
	}
	if int64(l.enqueueNew(streams)) == args.Count {
		// A full read did not wait for entries: its time is a round trip,
		// and more entries may wait.
		l.measureRead(time.Since(sent))
		l.more = true
	}
	return nil
}

// readArgs are those of XREADGROUP for new entries; a negative block means
// not to block.
func (l *groupLoop) readArgs(block time.Duration) *redis.XReadGroupArgs {
	return &redis.XReadGroupArgs{
		Group:    l.group,
		Consumer: l.consumer,
		Streams:  []string{l.key, ">"},
		Count:    l.prefetch.count(),
		Block:    block,
	}
}

// enqueueNew queues entries read for the first time and returns how many.
func (l *groupLoop) enqueueNew(streams []redis.XStream) int {
	n := 0
	for _, s := range streams {
		for _, m := range s.Messages {
			// A first delivery: the server's count is 1 by definition.
			l.queue = append(l.queue, entry{id: m.ID, fields: m.Values, count: 1})
			l.prefetch.read(m.Values)
			n++
		}
	}
	l.sub.stats.readAhead.Add(int64(n))
	return n
}

// enqueueWithCounts queues msgs, just read or claimed, with their delivery
// counts from the pending list (see admit). It returns how many were queued.
func (l *groupLoop) enqueueWithCounts(ctx context.Context, msgs []redis.XMessage) (int, error) {
	entries := make([]entry, len(msgs))
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		entries[i] = entry{id: m.ID, fields: m.Values}
		ids[i] = m.ID
		l.prefetch.read(m.Values)
	}
	counts, err := l.hold(ctx, ids)
	if err != nil {
		return 0, err
	}
	kept := l.admit(entries, counts)
	l.queue = append(l.queue, kept...)
	l.sub.stats.readAhead.Add(int64(len(kept)))
	return len(kept), nil
}

// hold renews this consumer's hold on the entries ids (renewScript) and
// returns, for each, the server's delivery count, -1 when its body is gone
// from the stream, or 0 when it is not pending for this consumer.
func (l *groupLoop) hold(ctx context.Context, ids []string) ([]int64, error) {
	args := make([]any, 0, len(ids)+2)
	args = append(args, l.group, l.consumer)
	for _, id := range ids {
		args = append(args, id)
	}
	counts, err := renewScript.Run(ctx, l.client, []string{l.key}, args...).Int64Slice()
	if err == nil && len(counts) != len(ids) {
		err = fmt.Errorf("renewal answered %d counts for %d entries", len(counts), len(ids))
	}
	return counts, err
}

// admit returns the entries that are pending for this consumer, with the
// server's counts (as hold reports them). An entry whose body is gone is
// acknowledged and counted, never delivered; one that another consumer holds
// now is left to it.
func (l *groupLoop) admit(entries []entry, counts []int64) []entry {
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
	return kept
}

// handle delivers e until it is Acked, redelivering it after each Nack, with
// message contexts derived from msgBase. It returns false when the
// subscription ended.
func (l *groupLoop) handle(ctx, msgBase context.Context, e entry) bool {
	l.inFlight = e.id
	defer func() { l.inFlight = "" }()
	for {
		msg, err := l.decode(&e)
		if err != nil {
			l.moveInvalid(ctx, e, err)
			return true
		}
		msg.Metadata.Set(MetadataDeliveryCount, strconv.FormatInt(e.count, 10))
		msgCtx, cancel := context.WithCancel(msgBase)
		msg.SetContext(msgCtx)
		result := l.deliver(ctx, msg)
		cancel()
		switch result {
		case acked:
			l.acks.add(e.id)
			if l.acks.atOnce() {
				l.flushWhileBusy(ctx)
			}
			return true
		case ackedThenStopped:
			l.acks.add(e.id)
			return false
		case stopped:
			return false
		case unsent:
			// No handler has seen it: a peer takes it.
			l.giveBack = append(l.giveBack, e.id)
			return false
		case lost:
			return true
		}
		l.sub.stats.nacked.Add(1)
		if ctx.Err() != nil {
			// Nacked while the subscription ends: a peer takes it.
			l.giveBack = append(l.giveBack, e.id)
			return false
		}
		delay := nackDelay(l.cfg, e.count)
		l.sub.stats.nackWaited(delay)
		fields := watermill.LogFields{"message_uuid": msg.UUID, "entry_id": e.id, "delivery_count": e.count, "retry_in": delay.String()}
		if ok, held := l.nackLog.allow(time.Now()); ok {
			fields["nacks_not_logged"] = held
			l.logger.Info("Message nacked; delivering it again after a delay", fields)
		} else {
			l.logger.Trace("Message nacked; delivering it again after a delay", fields)
		}
		next, ok := l.redeliver(ctx, e, delay)
		if !ok {
			return false
		}
		if next == nil {
			return true
		}
		e = *next
	}
}

// deliver hands msg, the message of the entry in flight, to the handler and
// waits until it is Acked or Nacked, sending due Acks and renewing the hold
// on held entries meanwhile. An entry that a renewal finds taken over by
// another consumer before the handler took it is not handed over (lost).
// When ctx ends while the handler has the message, it waits up to
// CloseGrace more for the Ack or Nack.
func (l *groupLoop) deliver(ctx context.Context, msg *message.Message) outcome {
	w := waits{out: l.out, msg: msg}
	closing := false
	for {
		w.flush, w.renew, w.read, w.ackSent = l.acks.due(), l.lease.due(true), l.ahead.doneChan(), l.sending.doneChan()
		switch w.next(ctx) {
		case evRead:
			l.landWhileBusy()
			l.decodeNext()
		case evAckSent:
			l.landAcks()
		case evSent:
			l.prefetch.handedOver(time.Now())
			l.sub.stats.delivered.Add(1)
			l.sub.observe.delivered(l.key, l.group, l.inFlight)
			w.sent()
			l.decodeNext()
		case evAcked:
			l.prefetch.settled(time.Now())
			l.acks.pace(l.prefetch.avg)
			if closing {
				return ackedThenStopped
			}
			return acked
		case evNacked:
			l.prefetch.settled(time.Now())
			return nacked
		case evFlush:
			l.sendAcks(ctx)
		case evRenew:
			if taken := l.renew(ctx); taken && w.out != nil {
				l.logger.Info("The entry waiting to be delivered was taken over by another consumer; not delivering it",
					watermill.LogFields{"entry_id": l.inFlight})
				return lost
			}
		case evStopped:
			if w.out != nil {
				return unsent
			}
			if closing || l.cfg.CloseGrace < 0 {
				return w.stopped()
			}
			// The handler has it: the calls made while it finishes get
			// CloseGrace, as the wait does.
			closing = true
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), l.cfg.CloseGrace)
			defer cancel()
		}
	}
}

// pause waits for d or until ctx ends, sending due Acks and renewing the
// hold on held entries meanwhile, and reports whether d passed.
func (l *groupLoop) pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	w := waits{timer: t.C}
	for {
		w.flush, w.renew = l.acks.due(), l.lease.due(l.inFlight != "" || len(l.queue) > 0)
		w.read, w.ackSent = l.ahead.doneChan(), l.sending.doneChan()
		switch w.next(ctx) {
		case evTimer:
			return true
		case evRead:
			l.landWhileBusy()
		case evAckSent:
			l.landAcks()
		case evFlush:
			l.sendAcks(ctx)
		case evRenew:
			l.renew(ctx)
		default:
			return false
		}
	}
}

// decode returns e's message, decoded ahead (see decodeNext) or now, with
// the metadata that tells where it came from.
func (l *groupLoop) decode(e *entry) (*message.Message, error) {
	if !e.decoded {
		l.prepare(e)
	}
	msg, err := e.msg, e.decodeErr
	e.msg, e.decodeErr, e.decoded = nil, nil, false
	return msg, err
}

func (l *groupLoop) prepare(e *entry) {
	e.decoded = true
	e.msg, e.decodeErr = decodeEntry(l.cfg.Unmarshaler, e.fields,
		origin{stream: l.key, entryID: e.id, group: l.group, consumer: l.consumer})
}

// decodeNext decodes the next queued entry while the handler works on the
// message just handed over, so that decoding is off the path from one
// message to the next.
func (l *groupLoop) decodeNext() {
	if len(l.queue) > 0 && !l.queue[0].decoded {
		l.prepare(&l.queue[0])
	}
}

// redeliver waits delay, then claims a Nacked entry again for this consumer,
// which grows its delivery count, and returns it with the new count, or nil when it is not
// this consumer's to deliver any more.
func (l *groupLoop) redeliver(ctx context.Context, e entry, delay time.Duration) (*entry, bool) {
	if !l.pause(ctx, delay) {
		return nil, false
	}
	for {
		next, err := l.claimBack(ctx, e)
		if err == nil {
			l.retries.succeeded()
			return next, true
		}
		if ctx.Err() != nil || !l.fault(ctx, "claiming a nacked entry back", err) {
			return nil, false
		}
	}
}

// claimBack runs claimBackScript for e, whose delivery was Nacked. The
// script claims e only while its count is still that of the Nacked
// delivery, so a call that the client sends again (after a network error)
// does not grow the count twice.
func (l *groupLoop) claimBack(ctx context.Context, e entry) (*entry, error) {
	reply, err := claimBackScript.Run(ctx, l.client, []string{l.key}, l.group, l.consumer, e.id, e.count).Slice()
	if err != nil {
		return nil, err
	}
	r, err := parseClaimBack(reply)
	if err != nil {
		return nil, err
	}
	switch r.status {
	case "ok":
		return &entry{id: e.id, fields: r.fields, count: r.count}, nil
	case "gone":
		l.logger.Debug("Nacked entry is no longer pending, not delivering it again", watermill.LogFields{"entry_id": e.id})
	case "taken":
		l.logger.Info("Nacked entry was taken over by another consumer meanwhile; leaving it to that consumer",
			watermill.LogFields{"entry_id": e.id})
	case "missing":
		l.reportMissing(e.id, true)
	}
	return nil, nil
}

// renew resets the idle time of every entry this loop holds, so that no peer
// reclaims an entry that is alive here. It drops from the queue any entry
// that is no longer pending for this consumer, and any whose body is gone
// from the stream (acknowledged and counted, never delivered). It reports
// whether the entry in flight was found taken over by another consumer.
func (l *groupLoop) renew(ctx context.Context) (inFlightTaken bool) {
	ids := make([]string, 0, len(l.queue)+1)
	if l.inFlight != "" {
		ids = append(ids, l.inFlight)
	}
	for _, e := range l.queue {
		ids = append(ids, e.id)
	}
	if len(ids) == 0 {
		return false
	}
	if l.acks.len() > 0 {
		// Acked entries wait for their flush unrenewed: send them now.
		l.flushWhileBusy(ctx)
	}
	counts, err := l.hold(ctx, ids)
	if l.lease.renewed(err) {
		l.logger.Error("Renewing the hold on held entries failed; retrying on the next beat, peers may reclaim them after ClaimMinIdle",
			err, watermill.LogFields{"entries": len(ids)})
	}
	if err != nil {
		l.sub.stats.faults.Add(1)
		return false
	}
	if l.inFlight != "" {
		// A message the handler has stays with it either way; an Ack or a
		// Nack settles what is left of it on the server.
		if counts[0] == 0 {
			inFlightTaken = true
			l.logger.Info("The entry in flight was taken over by another consumer", watermill.LogFields{"entry_id": l.inFlight})
		}
		counts = counts[1:]
	}
	held := len(l.queue)
	l.queue = l.admit(l.queue, counts)
	l.sub.stats.readAhead.Add(int64(len(l.queue) - held))
	return inFlightTaken
}

// reportMissing handles a pending entry whose body was trimmed or deleted: it
// is acknowledged (when still pending) and counted, never delivered.
func (l *groupLoop) reportMissing(id string, stillPending bool) {
	if stillPending {
		l.acks.add(id)
	}
	l.sub.stats.missingBodies.Add(1)
	l.logger.Error("Pending entry was trimmed or deleted from the stream before it was handled; acknowledged without delivery",
		nil, watermill.LogFields{"entry_id": id})
}

// moveInvalid copies an entry that cannot be decoded to the dead-letter
// stream, as a decodable message with its raw fields, the error and its
// origin (see invalidEntryRecord), then acknowledges it. If the copy fails,
// the entry stays pending and comes back with the next drain or reclaim.
// With NoDeadLetter it is logged with its raw fields and acknowledged.
func (l *groupLoop) moveInvalid(ctx context.Context, e entry, decodeErr error) {
	if l.cfg.DeadLetterSuffix == NoDeadLetter {
		l.acks.add(e.id)
		l.sub.stats.invalidEntries.Add(1)
		l.logger.Error("Entry cannot be decoded; acknowledged without a dead letter (DeadLetterSuffix is NoDeadLetter)", decodeErr,
			watermill.LogFields{"entry_id": e.id, "fields": e.fields})
		return
	}
	dest := l.key + l.cfg.DeadLetterSuffix
	record := invalidEntryRecord(e.fields, origin{
		topic:         l.key[len(l.cfg.KeyPrefix):],
		stream:        l.key,
		entryID:       e.id,
		group:         l.group,
		consumer:      l.consumer,
		deliveryCount: strconv.FormatInt(e.count, 10),
	}, decodeErr)
	fields := watermill.LogFields{"entry_id": e.id, "dead_letter_stream": dest, "message_uuid": record.UUID}
	values, err := DefaultMarshaler{}.Marshal("", record)
	if err == nil {
		err = l.client.XAdd(ctx, &redis.XAddArgs{Stream: dest, Values: values}).Err()
	}
	if err != nil {
		l.sub.stats.faults.Add(1)
		l.logger.Error("Entry cannot be decoded, and copying it to the dead-letter stream failed; it stays pending",
			errors.Join(decodeErr, err), fields)
		return
	}
	l.acks.add(e.id)
	l.sub.stats.invalidEntries.Add(1)
	l.logger.Error("Entry cannot be decoded; copied to the dead-letter stream and acknowledged", decodeErr, fields)
}

// flushWhileBusy sends the held Acks while the loop holds entries. A
// failure keeps them, to send again after a backoff.
func (l *groupLoop) flushWhileBusy(ctx context.Context) {
	if err := l.flushAcks(ctx); err != nil {
		l.sub.stats.faults.Add(1)
		if l.acks.failed() == 1 {
			l.logger.Error("Sending acks failed; keeping them to send again", err, nil)
		}
	}
}

// flushAcks sends the held Acks on their own.
func (l *groupLoop) flushAcks(ctx context.Context) error {
	if l.acks.len() == 0 {
		return nil
	}
	return l.settleAcks(l.acks.send(ctx, l.client, l.key, l.group))
}

// settleAcks reads the result of an XACK of the held Acks.
func (l *groupLoop) settleAcks(cmd *redis.IntCmd) error {
	n, err := l.acks.settle(cmd)
	if err == nil {
		l.sub.stats.acked.Add(n)
	}
	return err
}

// flushOnExit sends the Acks not sent yet and hands back the entries the
// loop holds and no handler has, in one round trip.
func (l *groupLoop) flushOnExit() {
	l.landAcks()
	l.landAheadOnExit()
	l.sub.stats.readAhead.Add(-int64(len(l.queue)))
	l.acks.stop()
	l.lease.stop()
	for _, e := range l.queue {
		l.giveBack = append(l.giveBack, e.id)
	}
	if l.acks.len() == 0 && len(l.giveBack) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
	defer cancel()
	pipe := l.client.Pipeline()
	var ack *redis.IntCmd
	if l.acks.len() > 0 {
		ack = l.acks.send(ctx, pipe, l.key, l.group)
	}
	var back *redis.Cmd
	if len(l.giveBack) > 0 {
		back = pipe.Do(ctx, handBackArgs(l.key, l.group, l.consumer, l.giveBack)...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if ack != nil {
		if err := l.settleAcks(ack); err != nil {
			l.sub.stats.faults.Add(1)
			l.logger.Error("Acks could not be sent before the subscription ended; those entries will be delivered again",
				err, watermill.LogFields{"entries": l.acks.len()})
		}
	}
	if back != nil {
		if err := back.Err(); err != nil {
			l.sub.stats.faults.Add(1)
			l.logger.Error("Handing back entries no handler has failed; peers reclaim them after ClaimMinIdle",
				err, watermill.LogFields{"entries": len(l.giveBack)})
		} else {
			l.logger.Debug("Handed back entries no handler has", watermill.LogFields{"entries": len(l.giveBack)})
		}
	}
}

// handedBackIdle is the idle time given to entries handed back: longer than
// any ClaimMinIdle, so that the next claim beat of a peer takes them.
const handedBackIdle = 30 * 24 * time.Hour

// handBackArgs is the call that hands entries ids back: XCLAIM on this
// consumer's own name with JUSTID, which leaves the delivery count alone, and
// an idle time no peer waits longer than.
func handBackArgs(key, group, consumer string, ids []string) []any {
	args := make([]any, 0, len(ids)+8)
	args = append(args, "XCLAIM", key, group, consumer, 0)
	for _, id := range ids {
		args = append(args, id)
	}
	return append(args, "IDLE", handedBackIdle.Milliseconds(), "JUSTID")
}

// fault handles a failed call: it re-runs the group door when the group or
// the stream vanished, backs off, and makes the loop drain its own pending
// list again before it reads anything new. It returns false when ctx ended
// during the backoff.
func (l *groupLoop) fault(ctx context.Context, what string, err error) bool {
	l.plan.restart()
	if redis.HasErrorPrefix(err, "NOGROUP") {
		l.logger.Error("Consumer group or stream vanished; creating it again", err, watermill.LogFields{"start": l.cfg.Start.String()})
		if derr := l.sub.openGroup(ctx, l.key); derr != nil {
			err = derr
		}
	}
	return l.retries.fail(ctx, what, err, l.pause)
}
