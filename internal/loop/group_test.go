package loop

import (
	"slices"
	"sync/atomic"
	"testing"
)

// held keeps the queue in stream order, the entry in flight first among the
// ids to hold, and the ReadAhead gauge equal to the queue's length.
func TestHeld(t *testing.T) {
	var gauge atomic.Int64
	h := held{gauge: &gauge}
	check := func(step string, queue []string, gaugeWant int64) {
		t.Helper()
		var got []string
		for _, e := range h.queue {
			got = append(got, e.id)
		}
		if !slices.Equal(got, queue) || gauge.Load() != gaugeWant {
			t.Fatalf("%s: queue %v, gauge %d; want %v, %d", step, got, gauge.Load(), queue, gaugeWant)
		}
	}
	if h.holding() {
		t.Fatal("an empty held holds something")
	}
	h.push(entry{id: "1-0"}, entry{id: "2-0"}, entry{id: "3-0"})
	check("push", []string{"1-0", "2-0", "3-0"}, 3)
	e := h.pop()
	h.inFlight = e.id
	check("pop", []string{"2-0", "3-0"}, 2)
	if got := h.ids(); !slices.Equal(got, []string{"1-0", "2-0", "3-0"}) {
		t.Fatalf("ids %v, want the one in flight first, then the queue", got)
	}
	h.keep(h.queue[1:]) // 2-0 was taken by another consumer
	check("keep", []string{"3-0"}, 1)
	h.handBack("1-0") // offered to nobody
	h.inFlight = ""
	if !h.holding() {
		t.Fatal("a queued entry is not held")
	}
	if got := h.leave(); !slices.Equal(got, []string{"1-0", "3-0"}) {
		t.Fatalf("leave %v, want the ids kept to hand back, then the queue", got)
	}
	check("leave", nil, 0)
	if h.holding() {
		t.Fatal("held after leave")
	}
}
