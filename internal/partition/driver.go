package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/bounded"
	"github.com/echomq/valkeystream/internal/failover"
	"github.com/echomq/valkeystream/internal/loop"
)

// DefaultHandOverPage is the default DriverConfig.HandOverPage.
const DefaultHandOverPage = 100

// DriverConfig is what a Driver reads.
type DriverConfig struct {
	// Group is the consumer group. Required.
	Group string
	// Member is the subscription's member id, also its consumer name in
	// every partition stream's group: give each subscription of a group an
	// id of its own, kept across restarts. Required.
	Member string
	// Start is the id the group starts after on a partition stream where it
	// does not exist yet (XGROUP CREATE ... MKSTREAM): "$" (new entries)
	// or "0" (the whole stream). Required.
	Start string

	// OwnerTTL is the time to live of an owner record: a partition of a
	// subscription that stopped without Close is acquired by a peer this
	// long after its last renewal. Required (the Subscriber's
	// PartitionOwnerTTL).
	OwnerTTL time.Duration
	// Beat is the time between two beats: each one renews the membership
	// and the ownerships, and moves partitions as the split says. At most a
	// third of OwnerTTL and of MemberTTL. Default: OwnerTTL/20.
	Beat time.Duration
	// MemberTTL is how long a member stays in the membership after its last
	// beat. Default: OwnerTTL, so that a member that died leaves the split
	// when its partitions become free.
	MemberTTL time.Duration
	// HandOverPage is about how many pending entries one call of the
	// hand-over moves. Default: DefaultHandOverPage.
	HandOverPage int64

	// Run handles one owned partition (see [Owned]) until ctx ends, and
	// returns once it has stopped using the ownership: its in-flight
	// entry finished, its last Acks sent. The group exists on the stream
	// and every entry left pending was handed over to Member when it is
	// called. It runs on a goroutine of its own per partition. Required.
	Run func(ctx context.Context, p Owned)

	// Hints are the client's failover hints for the partitions' Servers;
	// nil: none.
	Hints *failover.Hints
	// Waits, unless nil, bounds the blocking waits of the partitions'
	// loops in progress at once (see ServerOptions.Waits).
	Waits chan struct{}
	// Counters, unless nil, are counted into (shared with other drivers);
	// nil: the driver's own.
	Counters *DriverCounters
	// Logger logs the moves and the faults; nil: none.
	Logger watermill.LoggerAdapter
}

// setDefaults fills in the durations and sizes not given.
func (c *DriverConfig) setDefaults() {
	if c.Beat == 0 {
		c.Beat = c.OwnerTTL / 20
	}
	if c.MemberTTL == 0 {
		c.MemberTTL = c.OwnerTTL
	}
	if c.HandOverPage == 0 {
		c.HandOverPage = DefaultHandOverPage
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports the first setting that is missing or out of range.
func (c DriverConfig) Validate() error {
	switch {
	case c.Group == "":
		return errors.New("partition: the driver's Group is empty; name the consumer group")
	case c.Member == "":
		return errors.New("partition: the driver's Member is empty; give each subscription an id")
	case c.Start == "":
		return errors.New(`partition: the driver's Start is empty; give the group's start position, "$" or "0"`)
	case c.Run == nil:
		return errors.New("partition: the driver's Run is nil; it handles each owned partition")
	case c.Beat <= 0 || c.OwnerTTL <= 0 || c.MemberTTL <= 0:
		return fmt.Errorf("partition: the driver's Beat (%s), OwnerTTL (%s) and MemberTTL (%s) must be positive",
			c.Beat, c.OwnerTTL, c.MemberTTL)
	case 3*c.Beat > c.OwnerTTL || 3*c.Beat > c.MemberTTL:
		return fmt.Errorf("partition: the driver's Beat (%s) is more than a third of OwnerTTL (%s) or MemberTTL (%s); a late beat would let a live ownership lapse",
			c.Beat, c.OwnerTTL, c.MemberTTL)
	case c.HandOverPage < 1:
		return fmt.Errorf("partition: the driver's HandOverPage is %d; it must be at least 1", c.HandOverPage)
	}
	return nil
}

// Owned is one partition a Driver owns, handed to DriverConfig.Run.
type Owned struct {
	// Index is the partition's index in the layout.
	Index int
	// Ownership is the driver's ownership of it; the driver renews and
	// releases it.
	Ownership *Ownership
	// Server is the loop.Server of the partition; a call of it that finds
	// the ownership lost ends Run's ctx.
	Server *Server
	// Start is DriverConfig.Start, for the group door of a loop (see
	// Partition.CreateGroup).
	Start string
	// Fence is valid while messages of the partition may be handed over:
	// until the ownership's record may lapse within two beats by
	// this host's clock (no renewal reached the server for nearly the
	// TTL), and never again once the driver found the ownership lost. The
	// driver stops the loop on its next beat; the fence answers in
	// between. Hand the loop's messages over with [HandOver].
	Fence *Fence
}

// LoopConfig returns template for the partition: its stream, the group
// and consumer name of the ownership, no claim beat (a partition's entries
// are handed over, never claimed), and LoopClaimMinIdle in place of the
// template's, which is for topics that claim.
func (p Owned) LoopConfig(template loop.Config) loop.Config {
	keys := p.Ownership.Partition().Keys()
	template.Stream = keys.Stream
	template.Group = p.Ownership.Partition().Group()
	template.Consumer = p.Ownership.Token().Member
	template.ClaimInterval = -1
	template.ClaimMinIdle = LoopClaimMinIdle
	return template
}

// LoopClaimMinIdle is the ClaimMinIdle of a partition's loop. Nothing
// claims a partition's entries by idle time, so it only paces the loop's
// hold beat (a third of it) on the entries it holds, which keeps their idle
// times, as tools show them, those of a live consumer.
const LoopClaimMinIdle = 30 * time.Second

// DriverStats are a Driver's counters.
type DriverStats struct {
	// Rebalances counts the beats whose split gave the member other
	// partitions than the beat before.
	Rebalances int64
	// Acquired counts the partitions acquired.
	Acquired int64
	// Released counts the partitions released after their loop ended.
	Released int64
	// Lost counts the ownerships found lost (fenced): by a renewal, by a
	// call of the partition's Server, or by a hand-over.
	Lost int64
	// HandedOver counts the pending entries the hand-overs moved to the
	// member after its acquisitions.
	HandedOver int64
}

// Driver drives one subscription of a consumer group in a partitioned
// topic: on every beat it renews its membership, reads who owns each
// partition, computes the split ([Rebalance]), and moves partitions as
// the split says:
//   - a partition no longer given to it has its loop stopped (Run's ctx
//     ends), and is released once Run has returned, its in-flight entry
//     finished; it is renewed meanwhile;
//   - a partition given to it that nobody owns is acquired; the group is
//     created on its stream if need be, every entry left pending in it is
//     handed over, and then DriverConfig.Run handles it;
//   - a partition it keeps is renewed; one whose renewal, record or
//     Server finds the ownership lost has its loop stopped at once, and is
//     not released (it is not the driver's any more).
//
// One goroutine, Run's, owns the driver's state; each partition's Run
// goes on a goroutine of its own, which Run waits for before it returns.
type Driver struct {
	cfg     DriverConfig
	client  redis.UniversalClient
	members *Members
	parts   []*Partition

	started  atomic.Bool
	halted   chan struct{} // closed by halt (tests): Run returns as if the process died
	finished chan *tenure  // a partition's goroutine ended

	// Only Run's goroutine touches these.
	tenures  map[int]*tenure
	assigned []int

	owned atomic.Pointer[[]int]
	stats *DriverCounters
	// counted is how many partitions the Owned gauge counts for this
	// driver; only Run's goroutine touches it.
	counted int64
}

// DriverCounters are the counters of drivers (see DriverStats for what each
// counts), which the drivers of one Subscriber may share; Owned is a gauge
// of the partitions they hold.
type DriverCounters struct {
	Rebalances, Acquired, Released, Lost, HandedOver atomic.Int64
	Owned                                            atomic.Int64
	// Late counts the messages handed over after their fence stopped
	// being valid (HandOver.Late), when the Run of DriverConfig counts
	// them here.
	Late atomic.Int64
}

// tenure is the driver's ownership of one partition, from its
// acquisition until its goroutine ended.
type tenure struct {
	index    int
	o        *Ownership
	cancel   context.CancelFunc // ends Run's ctx
	stopping bool               // given to another member: released once it ends
	lost     atomic.Bool        // fenced: never released
	fence    *Fence             // lapsed when lost
}

// NewDriver returns the driver of the subscription of cfg.Member to the
// topic of layout in cfg.Group, through client. The config is copied,
// with its defaults filled in.
func NewDriver(client redis.UniversalClient, layout *Layout, cfg DriverConfig) (*Driver, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("partition: invalid driver config: %w", err)
	}
	d := &Driver{
		cfg:      cfg,
		client:   client,
		members:  NewMembers(client, layout.MembersKey(cfg.Group)),
		parts:    make([]*Partition, layout.N()),
		halted:   make(chan struct{}),
		finished: make(chan *tenure, layout.N()),
		tenures:  make(map[int]*tenure),
	}
	for i := range d.parts {
		d.parts[i] = NewPartition(client, layout.Keys(i, cfg.Group), cfg.Group)
	}
	d.owned.Store(&[]int{})
	d.stats = cfg.Counters
	if d.stats == nil {
		d.stats = new(DriverCounters)
	}
	return d, nil
}

// Stats returns the driver's counters.
func (d *Driver) Stats() DriverStats {
	return DriverStats{
		Rebalances: d.stats.Rebalances.Load(),
		Acquired:   d.stats.Acquired.Load(),
		Released:   d.stats.Released.Load(),
		Lost:       d.stats.Lost.Load(),
		HandedOver: d.stats.HandedOver.Load(),
	}
}

// Owned returns the partitions the driver holds now, ascending: those
// whose loops run, and those whose loops are stopping before their
// release.
func (d *Driver) Owned() []int { return slices.Clone(*d.owned.Load()) }

// Run drives the subscription until ctx ends, then closes it: it stops
// every partition's loop, leaves the membership (so that the peers' next
// beat splits the partitions without it), keeps renewing while the loops
// finish their in-flight entries, releases each partition once its loop
// has ended, and returns when all have. It may be called once.
func (d *Driver) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return errors.New("partition: Driver.Run was called twice; a driver runs once")
	}
	ticker := time.NewTicker(d.cfg.Beat)
	defer ticker.Stop()
	d.beat(ctx)
	for {
		select {
		case <-ctx.Done():
			d.close(context.WithoutCancel(ctx), ticker)
			return nil
		case <-d.halted:
			return nil
		case t := <-d.finished:
			d.ended(ctx, t)
		case <-ticker.C:
			d.beat(ctx)
		}
	}
}

// halt makes Run return at once without stopping, releasing or leaving
// anything, as a process that died would (its loops go on until Run's ctx
// ends, fenced once their records lapse). For tests.
func (d *Driver) halt() { close(d.halted) }

// beat renews the membership, reads the owner records, and moves the
// partitions as the split says.
func (d *Driver) beat(ctx context.Context) {
	var members []string
	err := d.call(ctx, func(ctx context.Context) (err error) {
		members, err = d.members.Beat(ctx, d.cfg.Member, d.cfg.MemberTTL)
		return err
	})
	var owners []string
	if err == nil {
		owners, err = d.owners(ctx)
	}
	if err != nil {
		// The renewals may still go through; the split waits for a beat
		// that reads.
		d.cfg.Logger.Error("Partition driver's beat could not read the membership or the owner records; trying again on the next beat", err, nil)
		d.renew(ctx)
		return
	}
	for i, t := range d.tenures {
		if owners[i] == "" && !t.lost.Load() {
			// Its record lapsed: the renewal below writes it again, unless
			// another member acquired the partition meanwhile.
			owners[i] = d.cfg.Member
		}
	}
	mine := Rebalance(owners, members)[d.cfg.Member]
	if !slices.Equal(mine, d.assigned) {
		d.stats.Rebalances.Add(1)
		d.cfg.Logger.Debug("Partition split changed", watermill.LogFields{"partitions": fmt.Sprint(mine), "members": len(members)})
		d.assigned = mine
	}
	for i, t := range d.tenures {
		if !t.stopping && !slices.Contains(mine, i) {
			t.stopping = true
			t.cancel()
			d.cfg.Logger.Debug("Stopping a partition given to another member", watermill.LogFields{"partition": i})
		}
	}
	d.renew(ctx)
	for _, i := range mine {
		if d.tenures[i] == nil && (owners[i] == "" || owners[i] == d.cfg.Member) {
			d.acquire(ctx, i)
		}
	}
	d.publish()
}

// owners reads every partition's owner record in one pipeline: the member
// of each ("" for none).
func (d *Driver) owners(ctx context.Context) ([]string, error) {
	owners := make([]string, len(d.parts))
	err := d.call(ctx, func(ctx context.Context) error {
		pipe := d.client.Pipeline()
		gets := make([]*redis.StringCmd, len(d.parts))
		for i, p := range d.parts {
			gets[i] = pipe.Get(ctx, p.keys.Owner)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		for i, get := range gets {
			record, err := get.Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return fmt.Errorf("partition: reading %q: %w", d.parts[i].keys.Owner, err)
			}
			t, err := parseToken(record)
			if err != nil {
				return err
			}
			owners[i] = t.Member
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return owners, nil
}

// renew renews every partition held and not lost, all at once (a slow node
// delays none of the others); a renewal that finds the ownership lost
// stops its loop. So does an ownership whose record may have lapsed by this
// host's clock, because no renewal reached the server for nearly its TTL
// (a cut, a stall): another member may own the partition by then, and
// entries this one read ahead must not be delivered alongside its.
func (d *Driver) renew(ctx context.Context) {
	type renewal struct {
		t       *tenure
		retaken bool
		err     error
	}
	done := make(chan renewal, len(d.tenures))
	n := 0
	for _, t := range d.tenures {
		if t.lost.Load() {
			continue
		}
		n++
		go func() {
			// The call may outlive d.call (see internal/bounded): it writes
			// its own variable, read only once it has returned.
			var retaken bool
			err := d.call(ctx, func(ctx context.Context) (err error) {
				retaken, err = t.o.Renew(ctx)
				return err
			})
			r := renewal{t: t, err: err}
			if err == nil {
				r.retaken = retaken
			}
			done <- r
		}()
	}
	for range n {
		r := <-done
		switch {
		case errors.Is(r.err, ErrFenced):
			d.lose(r.t, r.err)
		case r.err != nil:
			d.cfg.Logger.Error("Renewing a partition's ownership failed; trying again on the next beat", r.err,
				watermill.LogFields{"partition": r.t.index})
		case r.retaken:
			d.cfg.Logger.Info("A partition's owner record had lapsed, and nobody had acquired it; written again",
				watermill.LogFields{"partition": r.t.index})
		}
	}
	for _, t := range d.tenures {
		if !t.lost.Load() && !t.fence.Valid() {
			d.lose(t, fmt.Errorf("%w: no renewal reached the server since %s, and the record may lapse at %s",
				ErrFenced, t.o.Until().Add(-d.cfg.OwnerTTL).Format(time.RFC3339Nano), t.o.Until().Format(time.RFC3339Nano)))
		}
	}
}

// lose stops the loop of a partition whose ownership is lost, at once. It
// is called from Run's goroutine and from the partition's (by its
// Server's Lost).
func (d *Driver) lose(t *tenure, err error) {
	if !t.lost.CompareAndSwap(false, true) {
		return
	}
	t.fence.Lapse(err)
	t.cancel()
	d.stats.Lost.Add(1)
	d.cfg.Logger.Error("Lost the ownership of a partition; its loop stops", err, watermill.LogFields{"partition": t.index})
}

// acquire acquires partition i, and starts its goroutine: the group door,
// the hand-over, then DriverConfig.Run.
func (d *Driver) acquire(ctx context.Context, i int) {
	var o *Ownership
	err := d.call(ctx, func(ctx context.Context) (err error) {
		o, err = d.parts[i].Acquire(ctx, d.cfg.Member, d.cfg.OwnerTTL)
		return err
	})
	var held *HeldError
	if errors.As(err, &held) && held.Holder.Member == d.cfg.Member {
		// This member's own record without a tenure: an acquisition whose
		// reply was lost, or one this driver gave up (lapsing). Released,
		// so that the next beat acquires the partition afresh (hand-over
		// included), instead of leaving it unhandled until it lapses.
		rerr := d.call(ctx, d.parts[i].Adopt(held.Holder, d.cfg.OwnerTTL).Release)
		d.cfg.Logger.Info("Found this member's own record on a partition it does not handle; released it, to acquire it again",
			watermill.LogFields{"partition": i, "record": held.Holder.String(), "release_error": fmt.Sprint(rerr)})
		return
	}
	if errors.Is(err, ErrHeld) {
		d.cfg.Logger.Debug("A partition given to this member is held; acquiring it once it is released or lapses",
			watermill.LogFields{"partition": i, "error": err.Error()})
		return
	}
	if err != nil {
		d.cfg.Logger.Error("Acquiring a partition failed; trying again on the next beat", err, watermill.LogFields{"partition": i})
		return
	}
	d.stats.Acquired.Add(1)
	pctx, cancel := context.WithCancel(ctx)
	// The fence stops the hand-over two beats before the record may
	// lapse, by this host's clock: the loop must stop before it does.
	t := &tenure{index: i, o: o, cancel: cancel, fence: NewFence(o.Until, 2*d.cfg.Beat, time.Now)}
	d.tenures[i] = t
	srv := NewServer(o, ServerOptions{Hints: d.cfg.Hints, Lost: func(err error) { d.lose(t, err) }, Waits: d.cfg.Waits})
	d.cfg.Logger.Debug("Acquired a partition", watermill.LogFields{"partition": i, "epoch": o.Token().Epoch})
	go func() {
		defer func() { d.finished <- t }() // buffered: one per partition
		defer cancel()
		if d.prepare(pctx, t) {
			d.cfg.Run(pctx, Owned{Index: i, Ownership: o, Server: srv, Start: d.cfg.Start, Fence: t.fence})
		}
	}()
}

// prepare creates the group on the partition's stream if need be and hands
// over every entry left pending in it, trying again each beat, and
// reports whether it did before ctx ended or the ownership was lost.
func (d *Driver) prepare(ctx context.Context, t *tenure) bool {
	for {
		err := d.handOver(ctx, t)
		switch {
		case err == nil:
			return true
		case errors.Is(err, ErrFenced):
			d.lose(t, err)
			return false
		case ctx.Err() != nil:
			return false
		}
		d.cfg.Logger.Error("Handing over a partition's pending entries failed; trying again", err, watermill.LogFields{"partition": t.index})
		wait := time.NewTimer(d.cfg.Beat)
		select {
		case <-ctx.Done():
			wait.Stop()
			return false
		case <-wait.C:
		}
	}
}

// handOver creates the group if need be, then moves every entry pending in
// it to the owner, page by page.
func (d *Driver) handOver(ctx context.Context, t *tenure) error {
	p := t.o.Partition()
	if err := d.call(ctx, func(ctx context.Context) error { return p.CreateGroup(ctx, d.cfg.Start) }); err != nil {
		return err
	}
	var moved int64
	for from := "0-0"; ; {
		var h HandedOver
		err := d.call(ctx, func(ctx context.Context) (err error) {
			h, err = t.o.HandOver(ctx, from, d.cfg.HandOverPage)
			return err
		})
		if err != nil {
			return err
		}
		moved += h.Moved
		d.stats.HandedOver.Add(h.Moved)
		if h.Next == "0-0" {
			break
		}
		from = h.Next
	}
	if moved > 0 {
		d.cfg.Logger.Info("Handed over the entries previous owners left pending in a partition",
			watermill.LogFields{"partition": t.index, "entries": moved})
	}
	// The previous owners' names hold nothing now: removed, so that the
	// group lists its live owner only. A failure leaves them, harmless.
	if err := d.call(ctx, func(ctx context.Context) error { _, err := t.o.Prune(ctx); return err }); err != nil && !errors.Is(err, ErrFenced) {
		d.cfg.Logger.Debug("Could not remove the previous owners' consumer names from a partition's group",
			watermill.LogFields{"partition": t.index, "error": err.Error()})
	}
	return nil
}

// ended handles the end of a partition's goroutine: a partition not lost
// is released, whether it was stopped or its loop ended on its own (the
// next beat acquires it again if it is still this member's).
func (d *Driver) ended(ctx context.Context, t *tenure) {
	if d.forget(ctx, t) {
		d.release(ctx, t)
	}
}

// forget drops the tenure of a partition whose goroutine ended, and
// reports whether it is to be released (it was not lost).
func (d *Driver) forget(ctx context.Context, t *tenure) bool {
	delete(d.tenures, t.index)
	d.publish()
	if t.lost.Load() {
		return false
	}
	if !t.stopping && ctx.Err() == nil {
		d.cfg.Logger.Error("A partition's loop ended on its own; releasing the partition", nil, watermill.LogFields{"partition": t.index})
	}
	return true
}

// release releases t's partition, also when ctx has just ended (Close).
func (d *Driver) release(ctx context.Context, t *tenure) {
	err := d.call(context.WithoutCancel(ctx), t.o.Release)
	switch {
	case errors.Is(err, ErrFenced):
		d.lose(t, err)
	case err != nil:
		// Its record lapses after OwnerTTL.
		d.cfg.Logger.Error("Releasing a partition failed; a peer acquires it once its record lapses", err,
			watermill.LogFields{"partition": t.index})
	default:
		d.stats.Released.Add(1)
		d.cfg.Logger.Debug("Released a partition", watermill.LogFields{"partition": t.index})
	}
}

// close stops every loop, leaves the membership, renews while the loops
// finish, and releases each partition once its loop has ended, the
// releases side by side (against a server that does not answer, Close
// takes one call's bound, not one per partition).
func (d *Driver) close(ctx context.Context, ticker *time.Ticker) {
	for _, t := range d.tenures {
		t.stopping = true
		t.cancel()
	}
	if err := d.call(ctx, func(ctx context.Context) error { return d.members.Leave(ctx, d.cfg.Member) }); err != nil {
		d.cfg.Logger.Error("Leaving the membership failed; peers move this member's partitions once it expires", err, nil)
	}
	var releases sync.WaitGroup
	defer releases.Wait()
	for len(d.tenures) > 0 {
		select {
		case t := <-d.finished:
			if d.forget(ctx, t) {
				releases.Add(1)
				go func() {
					defer releases.Done()
					d.release(ctx, t)
				}()
			}
		case <-ticker.C:
			d.renew(ctx)
		case <-d.halted:
			return
		}
	}
}

// publish stores the partitions held, for Owned.
func (d *Driver) publish() {
	owned := make([]int, 0, len(d.tenures))
	for i := range d.tenures {
		owned = append(owned, i)
	}
	slices.Sort(owned)
	d.owned.Store(&owned)
	d.stats.Owned.Add(int64(len(owned)) - d.counted)
	d.counted = int64(len(owned))
}

// call runs f with a context bounded by a quarter of OwnerTTL (so that one
// slow call leaves time for the renewals, and a Close against a server
// that does not answer ends), returning when ctx ends whatever the
// client's options (see internal/bounded).
func (d *Driver) call(ctx context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.OwnerTTL/4)
	defer cancel()
	var err error
	if berr := bounded.Call(ctx, func() { err = f(ctx) }); berr != nil {
		return berr
	}
	return err
}
