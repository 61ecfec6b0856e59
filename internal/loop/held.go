package loop

import (
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

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
	queue    []entry
	inFlight string // id of the entry in flight, or ""
	giveBack []string
	gauge    *atomic.Int64
}

// push queues es after what is queued.
func (h *held) push(es ...entry) {
	h.queue = append(h.queue, es...)
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
	h.queue = nil
	ids := h.giveBack
	h.giveBack = nil
	return ids
}
