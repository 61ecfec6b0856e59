package valkeystream

import (
	"sync/atomic"
	"time"
)

// DeliveryObserver is told of every message a subscription hands to a
// handler, redeliveries included. The metrics package implements it to
// report the age of entries at delivery.
type DeliveryObserver interface {
	// ObserveDelivery is called by the subscription's own goroutine when it
	// hands a message of the stream key (and the consumer group, "" in
	// fan-out) to a handler. age is this host's clock minus the time in
	// the entry id, which the server's clock wrote when the entry was
	// added; 0 when that time is ahead of this host's clock. It must
	// return promptly: the subscription waits for it.
	ObserveDelivery(stream, group string, age time.Duration)
}

// SetDeliveryObserver makes o the Subscriber's DeliveryObserver, for every
// subscription, running or started later; nil removes it. A Subscriber
// has at most one: a later call replaces the earlier one. Without one, a
// delivery costs one atomic load more.
func (s *Subscriber) SetDeliveryObserver(o DeliveryObserver) {
	if o == nil {
		s.observe.o.Store(nil)
		return
	}
	s.observe.o.Store(&o)
}

// deliveryHook is where the loops report each hand-over.
type deliveryHook struct {
	o atomic.Pointer[DeliveryObserver]
}

// delivered reports the hand-over of entry id of stream, read with group
// ("" in fan-out), to the observer if there is one. A group loop calls it
// when the handler took the message; a fan-out loop when it offers it
// (its handler takes the next message as soon as it settled the last).
func (h *deliveryHook) delivered(stream, group, id string) {
	o := h.o.Load()
	if o == nil {
		return
	}
	ms, ok := entryMillis(id)
	if !ok {
		return
	}
	(*o).ObserveDelivery(stream, group, max(0, time.Since(time.UnixMilli(ms))))
}

// entryMillis returns the milliseconds part of a stream entry id such as
// "1700000000000-0", and whether id has one.
func entryMillis(id string) (int64, bool) {
	var ms int64
	i := 0
	for ; i < len(id) && id[i] != '-'; i++ {
		c := id[i]
		if c < '0' || c > '9' || ms > (1<<63-1-9)/10 {
			return 0, false
		}
		ms = ms*10 + int64(c-'0')
	}
	return ms, i > 0
}
