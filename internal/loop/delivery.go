package loop

import (
	"context"
	"sync/atomic"
)

// Delivery is what a delivered message's context tells of the entry it
// came from (see DeliveryOf). A handling that acknowledges the entry on the
// server itself, in one step with other writes (valkeystream.ExactlyOnce),
// calls Settle, so that the message's Ack sends no XACK of its own.
type Delivery struct {
	Stream, Group, Consumer string
	ID                      string
	// Count is the entry's delivery count on the server, this delivery
	// included.
	Count        int64
	settled      atomic.Bool
	acknowledged atomic.Bool
}

// Settle tells the loop that no XACK must follow the message's Ack: the
// entry was acknowledged on the server already, or it is handled by
// another consumer now and an XACK from this one would take it from there.
func (d *Delivery) Settle() { d.settled.Store(true) }

// Settled reports whether Settle (or SettleAcknowledged) was called.
func (d *Delivery) Settled() bool { return d.settled.Load() }

// SettleAcknowledged is Settle for an entry this delivery's handling
// acknowledged itself, on the server (the step of ExactlyOnce): the loop
// counts it in Counters.Acked when the message's Ack comes, as it counts
// an XACK of its own.
func (d *Delivery) SettleAcknowledged() {
	d.acknowledged.Store(true)
	d.settled.Store(true)
}

// deliveryKey is the context key of a delivery.
type deliveryKey struct{}

// deliveryContext carries a delivery: one allocation per delivery, for both
// the context value and the Delivery.
type deliveryContext struct {
	context.Context
	d Delivery
}

func (c *deliveryContext) Value(key any) any {
	if key == (deliveryKey{}) {
		return &c.d
	}
	return c.Context.Value(key)
}

// withDelivery returns a child of parent that carries the delivery of e.
func (l *Group) withDelivery(parent context.Context, e *entry) (context.Context, *Delivery) {
	c := &deliveryContext{Context: parent}
	c.d = Delivery{Stream: l.cfg.Stream, Group: l.cfg.Group, Consumer: l.cfg.Consumer, ID: e.id, Count: e.count}
	return c, &c.d
}

// DeliveryOf returns the delivery a message context of a group
// subscription carries, or nil.
func DeliveryOf(ctx context.Context) *Delivery {
	d, _ := ctx.Value(deliveryKey{}).(*Delivery)
	return d
}
