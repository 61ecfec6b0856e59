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
// touches it. It recovers before it reads anything new: after a start or a
// fault it drains its own pending entries from cursor 0; on every claim beat
// it reclaims entries that consumers left idle; only then it reads new
// entries. It fetches only when nothing it fetched is still undelivered and
// every Ack has been sent (at the latest in the same round trip, ahead of a
// read of new entries), so it never claims an entry it is handling, and
// while it holds entries it renews its hold on them so that no peer reclaims
// them from under it.
type groupLoop struct {
	sub      *Subscriber
	cfg      *SubscriberConfig
	client   redis.UniversalClient
	key      string
	group    string
	consumer string
	out      chan *message.Message
	logger   watermill.LoggerAdapter

	queue    []entry // fetched, not yet delivered, in order
	inFlight string  // id of the entry in a handler's hands, or ""

	acks      []string    // Acked ids not yet sent
	ackTimer  *time.Timer // fires when the oldest of acks is due
	ackFaults int         // consecutive failed flushes while busy

	leaseTimer   *time.Timer // fires when the held entries need renewing
	leaseEvery   time.Duration
	leaseFailing bool // the last renewal failed (logged once per streak)

	draining  bool   // the own pending list is being drained
	drainFrom string // cursor of the drain
	claimFrom string // cursor of XAUTOCLAIM
	nextClaim time.Time

	retries retries

	sweeper     *sweeper // removes departed consumers on the claim beat
	releaseName func()   // releases the consumer name's lease; called on exit
}

func newGroupLoop(s *Subscriber, key, consumer string, out chan *message.Message, logger watermill.LoggerAdapter) *groupLoop {
	return &groupLoop{
		sub:        s,
		cfg:        &s.config,
		client:     s.config.Client,
		key:        key,
		group:      s.config.ConsumerGroup,
		consumer:   consumer,
		out:        out,
		logger:     logger,
		retries:    retries{sub: s, logger: logger},
		ackTimer:   stoppedTimer(),
		leaseTimer: stoppedTimer(),
		// Three renewals fit in one ClaimMinIdle, so a late one still holds.
		leaseEvery: s.config.ClaimMinIdle / 3,
		draining:   true,
		drainFrom:  "0",
		claimFrom:  "0-0",
	}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

func (l *groupLoop) run(ctx context.Context) {
	defer close(l.out)
	defer l.releaseName()
	defer l.flushOnExit()
	for ctx.Err() == nil {
		if len(l.queue) == 0 {
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
		if !l.handle(ctx, e) {
			return
		}
	}
}

// fetch fills the queue: from the own pending list while draining, else from
// idle entries of others when the claim beat is due, else with new entries.
func (l *groupLoop) fetch(ctx context.Context) error {
	var err error
	switch {
	case l.draining:
		if err = l.flushAcks(ctx); err == nil {
			err = l.drain(ctx)
		}
	case !time.Now().Before(l.nextClaim):
		if err = l.flushAcks(ctx); err == nil {
			err = l.claim(ctx)
		}
	default:
		err = l.readNew(ctx)
	}
	if len(l.queue) > 0 {
		l.leaseTimer.Reset(l.leaseEvery)
	}
	return err
}

func (l *groupLoop) drain(ctx context.Context) error {
	streams, err := l.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    l.group,
		Consumer: l.consumer,
		Streams:  []string{l.key, l.drainFrom},
		Count:    l.cfg.BatchSize,
		Block:    -1,
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("draining own pending entries: %w", err)
	}
	var msgs []redis.XMessage
	if len(streams) > 0 {
		msgs = streams[0].Messages
	}
	if len(msgs) == 0 {
		l.draining = false
		return nil
	}
	l.drainFrom = msgs[len(msgs)-1].ID
	n, err := l.enqueueWithCounts(ctx, msgs)
	if err != nil {
		return fmt.Errorf("reading delivery counts of drained entries: %w", err)
	}
	l.sub.stats.drained.Add(int64(n))
	l.logger.Debug("Drained own pending entries", watermill.LogFields{"entries": len(msgs)})
	return nil
}

func (l *groupLoop) claim(ctx context.Context) error {
	reply, err := l.client.Do(ctx, "XAUTOCLAIM", l.key, l.group, l.consumer,
		l.cfg.ClaimMinIdle.Milliseconds(), l.claimFrom, "COUNT", l.cfg.BatchSize).Slice()
	if err != nil {
		return fmt.Errorf("reclaiming idle entries: %w", err)
	}
	next, msgs, deleted, nulls, err := parseAutoClaim(reply)
	if err != nil {
		return fmt.Errorf("reclaiming idle entries: %w", err)
	}
	if nulls > 0 {
		// Claimed entries whose bodies are gone, reported without their ids:
		// they are pending for this consumer now, and a drain of its own
		// pending list names them, so that they are acknowledged.
		l.draining, l.drainFrom = true, "0"
	}
	l.claimFrom = next
	if next == "0-0" {
		// The pending list was scanned to its end; the next beat starts over.
		// Until then, a cursor other than 0-0 means more to reclaim first.
		l.nextClaim = time.Now().Add(l.cfg.ClaimInterval)
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
	if len(l.acks) > 0 {
		pipe := l.client.Pipeline()
		ack := pipe.XAck(ctx, l.key, l.group, l.acks...)
		read := pipe.XReadGroup(ctx, l.readArgs(-1))
		_, _ = pipe.Exec(ctx) // each command carries its own error
		streams, err := read.Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		if ackErr := l.acked(ack); ackErr != nil {
			// A fault like a failed read: the entries this read brought, if
			// any, are pending for this consumer and come back with the
			// drain that follows.
			return ackErr
		}
		if err != nil {
			return fmt.Errorf("reading new entries: %w", err)
		}
		if l.enqueueNew(streams) > 0 {
			return nil
		}
	}
	streams, err := l.client.XReadGroup(ctx, l.readArgs(l.cfg.BlockTime)).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading new entries: %w", err)
	}
	l.enqueueNew(streams)
	return nil
}

// readArgs are those of XREADGROUP for new entries; a negative block means
// not to block.
func (l *groupLoop) readArgs(block time.Duration) *redis.XReadGroupArgs {
	return &redis.XReadGroupArgs{
		Group:    l.group,
		Consumer: l.consumer,
		Streams:  []string{l.key, ">"},
		Count:    l.cfg.BatchSize,
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
			n++
		}
	}
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
	}
	counts, err := l.hold(ctx, ids)
	if err != nil {
		return 0, err
	}
	kept := l.admit(entries, counts)
	l.queue = append(l.queue, kept...)
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

// handle delivers e until it is Acked, redelivering it after each Nack. It
// returns false when the subscription ended.
func (l *groupLoop) handle(ctx context.Context, e entry) bool {
	l.inFlight = e.id
	defer func() { l.inFlight = "" }()
	for {
		msg, err := l.decode(&e)
		if err != nil {
			l.moveInvalid(ctx, e, err)
			return true
		}
		msg.Metadata.Set(MetadataDeliveryCount, strconv.FormatInt(e.count, 10))
		msgCtx, cancel := context.WithCancel(ctx)
		msg.SetContext(msgCtx)
		result := deliver(ctx, l.out, msg, l, &l.sub.stats.delivered)
		cancel()
		switch result {
		case acked:
			l.addAck(e.id)
			return true
		case ackedThenStopped:
			l.addAck(e.id)
			return false
		case stopped:
			return false
		}
		l.sub.stats.nacked.Add(1)
		l.logger.Trace("Message nacked, delivering it again", watermill.LogFields{
			"message_uuid": msg.UUID, "entry_id": e.id, "delivery_count": e.count})
		next, ok := l.redeliver(ctx, e.id)
		if !ok {
			return false
		}
		if next == nil {
			return true
		}
		e = *next
	}
}

// decode returns e's message, decoded ahead (see handedOver) or now, with
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

// handedOver decodes the next queued entry while the handler works on the
// message just handed over, so that decoding is off the path from one
// message to the next.
func (l *groupLoop) handedOver() {
	if len(l.queue) > 0 && !l.queue[0].decoded {
		l.prepare(&l.queue[0])
	}
}

// redeliver claims a Nacked entry again for this consumer, which grows its
// delivery count, and returns it with the new count, or nil when it is not
// this consumer's to deliver any more.
func (l *groupLoop) redeliver(ctx context.Context, id string) (*entry, bool) {
	if !pause(ctx, l.cfg.NackResendDelay, l) {
		return nil, false
	}
	for {
		next, err := l.claimBack(ctx, id)
		if err == nil {
			l.retries.succeeded()
			return next, true
		}
		if ctx.Err() != nil || !l.fault(ctx, "claiming a nacked entry back", err) {
			return nil, false
		}
	}
}

func (l *groupLoop) claimBack(ctx context.Context, id string) (*entry, error) {
	reply, err := claimBackScript.Run(ctx, l.client, []string{l.key}, l.group, l.consumer, id).Slice()
	if err != nil {
		return nil, err
	}
	status, _ := reply[0].(string)
	switch status {
	case "ok":
		if len(reply) != 3 {
			return nil, fmt.Errorf("unexpected reply to the nack claim: %v", reply)
		}
		count, ok := reply[1].(int64)
		if !ok {
			return nil, fmt.Errorf("unexpected delivery count %v in the reply to the nack claim", reply[1])
		}
		fields, err := fieldMap(reply[2])
		if err != nil {
			return nil, err
		}
		return &entry{id: id, fields: fields, count: count}, nil
	case "gone":
		l.logger.Debug("Nacked entry is no longer pending, not delivering it again", watermill.LogFields{"entry_id": id})
	case "taken":
		l.logger.Info("Nacked entry was taken over by another consumer meanwhile; leaving it to that consumer",
			watermill.LogFields{"entry_id": id})
	case "missing":
		l.reportMissing(id, false) // the script acknowledged it
	default:
		return nil, fmt.Errorf("unexpected reply to the nack claim: %v", reply)
	}
	return nil, nil
}

// renewLeases resets the idle time of every entry this loop holds, so that
// no peer reclaims an entry that is alive here. It drops from the queue any
// entry that is no longer pending for this consumer, and any whose body is
// gone from the stream (acknowledged and counted, never delivered).
func (l *groupLoop) renewLeases(ctx context.Context) {
	ids := make([]string, 0, len(l.queue)+1)
	if l.inFlight != "" {
		ids = append(ids, l.inFlight)
	}
	for _, e := range l.queue {
		ids = append(ids, e.id)
	}
	if len(ids) == 0 {
		return
	}
	defer l.leaseTimer.Reset(l.leaseEvery)
	if len(l.acks) > 0 {
		// Acked entries wait for their flush unrenewed: send them now.
		l.flushWhileBusy(ctx)
	}
	counts, err := l.hold(ctx, ids)
	if err != nil {
		l.sub.stats.faults.Add(1)
		if !l.leaseFailing {
			l.logger.Error("Renewing the hold on held entries failed; retrying on the next beat, peers may reclaim them after ClaimMinIdle",
				err, watermill.LogFields{"entries": len(ids)})
			l.leaseFailing = true
		}
		return
	}
	l.leaseFailing = false
	if l.inFlight != "" {
		// The handler has the message either way; an Ack or a Nack settles
		// what is left of it on the server.
		if counts[0] == 0 {
			l.logger.Info("The entry being handled was taken over by another consumer", watermill.LogFields{"entry_id": l.inFlight})
		}
		counts = counts[1:]
	}
	l.queue = l.admit(l.queue, counts)
}

// leaseDue returns the channel that fires when held entries need renewing.
func (l *groupLoop) leaseDue() <-chan time.Time {
	if l.inFlight == "" && len(l.queue) == 0 {
		return nil
	}
	return l.leaseTimer.C
}

// reportMissing handles a pending entry whose body was trimmed or deleted: it
// is acknowledged (when still pending) and counted, never delivered.
func (l *groupLoop) reportMissing(id string, stillPending bool) {
	if stillPending {
		l.addAck(id)
	}
	l.sub.stats.missingBodies.Add(1)
	l.logger.Error("Pending entry was trimmed or deleted from the stream before it was handled; acknowledged without delivery",
		nil, watermill.LogFields{"entry_id": id})
}

// moveInvalid copies an entry that cannot be decoded to the dead-letter
// stream, as a decodable message with its raw fields, the error and its
// origin (see invalidEntryRecord), then acknowledges it. If the copy fails,
// the entry stays pending and comes back with the next drain or reclaim.
func (l *groupLoop) moveInvalid(ctx context.Context, e entry, decodeErr error) {
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
	l.addAck(e.id)
	l.sub.stats.invalidEntries.Add(1)
	l.logger.Error("Entry cannot be decoded; copied to the dead-letter stream and acknowledged", decodeErr, fields)
}

func (l *groupLoop) addAck(id string) {
	l.acks = append(l.acks, id)
	if len(l.acks) == 1 {
		l.ackTimer.Reset(l.cfg.AckFlushInterval)
	}
}

// flushDue returns the channel that fires when Acks are due, or nil.
func (l *groupLoop) flushDue() <-chan time.Time {
	if len(l.acks) == 0 {
		return nil
	}
	return l.ackTimer.C
}

// flushWhileBusy sends due Acks while a message is being handled. A failure
// keeps them for the next try, after a backoff.
func (l *groupLoop) flushWhileBusy(ctx context.Context) {
	if err := l.flushAcks(ctx); err != nil {
		l.ackFailed(err)
	}
}

// ackFailed keeps the Acks that could not be sent, to send them again after
// a backoff.
func (l *groupLoop) ackFailed(err error) {
	l.sub.stats.faults.Add(1)
	l.ackFaults++
	if l.ackFaults == 1 {
		l.logger.Error("Sending acks failed; keeping them to send again", err, nil)
	}
	l.ackTimer.Reset(backoff(l.ackFaults))
}

func (l *groupLoop) flushAcks(ctx context.Context) error {
	if len(l.acks) == 0 {
		return nil
	}
	return l.acked(l.client.XAck(ctx, l.key, l.group, l.acks...))
}

// acked settles the sending of the Acks waiting to be sent.
func (l *groupLoop) acked(cmd *redis.IntCmd) error {
	n, err := cmd.Result()
	if err != nil {
		return fmt.Errorf("acknowledging %d entries: %w", len(l.acks), err)
	}
	l.sub.stats.acked.Add(n)
	l.acks = l.acks[:0]
	l.ackTimer.Stop()
	l.ackFaults = 0
	return nil
}

func (l *groupLoop) flushOnExit() {
	l.ackTimer.Stop()
	l.leaseTimer.Stop()
	if len(l.acks) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
	defer cancel()
	if err := l.flushAcks(ctx); err != nil {
		l.sub.stats.faults.Add(1)
		l.logger.Error("Acks could not be sent before the subscription ended; those entries will be delivered again",
			err, watermill.LogFields{"entries": len(l.acks)})
	}
}

// fault handles a failed call: it re-runs the group door when the group or
// the stream vanished, backs off, and makes the loop drain its own pending
// list again before it reads anything new. It returns false when ctx ended
// during the backoff.
func (l *groupLoop) fault(ctx context.Context, what string, err error) bool {
	l.draining, l.drainFrom = true, "0"
	if redis.HasErrorPrefix(err, "NOGROUP") {
		l.logger.Error("Consumer group or stream vanished; creating it again", err, watermill.LogFields{"start": l.cfg.Start.String()})
		if derr := l.sub.openGroup(ctx, l.key); derr != nil {
			err = derr
		}
	}
	return l.retries.fail(ctx, what, err, l)
}

// parseAutoClaim reads an XAUTOCLAIM reply: the next cursor, the claimed
// entries, the ids the server dropped because their bodies are gone (Redis 7
// and later, Valkey), and how many claimed entries came back as a bare null
// (Redis 6.2 reports a claimed entry whose body is gone that way, without its
// id, and keeps it pending for the claiming consumer).
func parseAutoClaim(reply []any) (next string, msgs []redis.XMessage, deleted []string, nulls int, err error) {
	if len(reply) < 2 {
		return "", nil, nil, 0, fmt.Errorf("unexpected XAUTOCLAIM reply with %d elements", len(reply))
	}
	next, ok := reply[0].(string)
	if !ok {
		return "", nil, nil, 0, fmt.Errorf("unexpected XAUTOCLAIM cursor of type %T", reply[0])
	}
	list, _ := reply[1].([]any)
	for _, item := range list {
		if item == nil {
			nulls++
			continue
		}
		pair, ok := item.([]any)
		if !ok || len(pair) != 2 {
			return "", nil, nil, 0, fmt.Errorf("unexpected XAUTOCLAIM entry %v", item)
		}
		id, ok := pair[0].(string)
		if !ok {
			return "", nil, nil, 0, fmt.Errorf("unexpected XAUTOCLAIM entry id of type %T", pair[0])
		}
		m := redis.XMessage{ID: id}
		if pair[1] != nil {
			if m.Values, err = fieldMap(pair[1]); err != nil {
				return "", nil, nil, 0, err
			}
		}
		msgs = append(msgs, m)
	}
	if len(reply) >= 3 {
		ids, _ := reply[2].([]any)
		for _, v := range ids {
			if id, ok := v.(string); ok {
				deleted = append(deleted, id)
			}
		}
	}
	return next, msgs, deleted, nulls, nil
}

// fieldMap turns an entry's field list (or map, in RESP3) into a map.
func fieldMap(v any) (map[string]any, error) {
	switch f := v.(type) {
	case []any:
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("entry has an odd number (%d) of field elements", len(f))
		}
		m := make(map[string]any, len(f)/2)
		for i := 0; i < len(f); i += 2 {
			k, ok := f[i].(string)
			if !ok {
				return nil, fmt.Errorf("entry field name of type %T", f[i])
			}
			m[k] = f[i+1]
		}
		return m, nil
	case map[any]any:
		m := make(map[string]any, len(f))
		for k, val := range f {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("entry field name of type %T", k)
			}
			m[ks] = val
		}
		return m, nil
	default:
		return nil, fmt.Errorf("entry fields of type %T", v)
	}
}
