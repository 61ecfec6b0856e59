package loop

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// fired reports whether c fires within d (nil never fires).
func fired(c <-chan time.Time, d time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(d):
		return false
	}
}

func testAcks(every time.Duration) (*acks, *Counters) {
	c := &Counters{}
	a := newAcks(every, c, watermill.NopLogger{})
	return &a, c
}

func TestAcksAreDueAfterTheirInterval(t *testing.T) {
	b, _ := testAcks(50 * time.Millisecond)
	if b.due() != nil {
		t.Fatal("no Acks, yet a due channel, want nil")
	}
	b.add("1-0")
	b.add("2-0")
	if got := b.len(); got != 2 {
		t.Fatalf("len is %d, want 2", got)
	}
	if !fired(b.due(), 10*time.Second) {
		t.Fatal("the Acks never came due")
	}
}

func TestAcksAtOnceAreDueAtOnce(t *testing.T) {
	b, _ := testAcks(-1)
	if !b.atOnce() {
		t.Fatal("atOnce is false for a negative interval")
	}
	b.add("1-0")
	// At once: due without waiting an interval (a generous bound, never a
	// speed requirement).
	if !fired(b.due(), 10*time.Second) {
		t.Fatal("the Acks never came due")
	}
}

func TestAcksWaitFollowsTheHandler(t *testing.T) {
	tests := []struct {
		name   string
		every  time.Duration
		settle time.Duration
		want   time.Duration
	}{
		{"unknown pace waits the interval", 100 * time.Millisecond, 0, 100 * time.Millisecond},
		{"a fast handler waits the floor", 100 * time.Millisecond, 10 * time.Microsecond, ackWaitMin},
		{"a 5 ms handler waits two of its messages", 100 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond},
		{"a slow handler waits no longer than the interval", 100 * time.Millisecond, time.Second, 100 * time.Millisecond},
		{"at once stays at once", -1, 5 * time.Millisecond, -1},
	}
	for _, tt := range tests {
		b, _ := testAcks(tt.every)
		b.pace(tt.settle)
		if b.wait != tt.want {
			t.Errorf("%s: wait = %s, want %s", tt.name, b.wait, tt.want)
		}
	}
}

// Every Ack is taken into the round trip that carries it, and its outcome
// comes back through landed: counted on success; on failure put back ahead
// of the Acks made meanwhile and due again after a backoff; a failure no
// fetch reports is counted as a fault by failed.
func TestAcksTakeAndLanded(t *testing.T) {
	b, c := testAcks(time.Hour)
	b.add("1-0")
	b.add("2-0")
	taken := b.take()
	if !slices.Equal(taken, []string{"1-0", "2-0"}) {
		t.Fatalf("take: %v; want both ids", taken)
	}
	if b.len() != 0 || b.due() != nil {
		t.Fatalf("after take: len %d, due %v; want no Acks and nothing due", b.len(), b.due())
	}
	b.add("3-0") // made while the taken ones are on their way
	if err := b.landed(taken, TripReply{AckErr: errors.New("connection reset")}); err == nil {
		t.Fatal("landed of a failed XACK returned no error")
	}
	if got := b.ids; !slices.Equal(got, []string{"1-0", "2-0", "3-0"}) {
		t.Fatalf("after a failed send: %v, want the taken ids ahead of the new one", got)
	}
	if b.faults != 1 || c.Faults.Load() != 0 {
		t.Fatalf("a failed send counted %d failures (%d faults), want 1 (and no fault until reported)", b.faults, c.Faults.Load())
	}
	b.failed(errors.New("connection reset"))
	if c.Faults.Load() != 1 {
		t.Fatalf("a reported failure counted %d faults, want 1", c.Faults.Load())
	}
	if !fired(b.due(), 10*time.Second) {
		t.Fatal("restored ids never came due again")
	}
	again := b.take()
	if len(again) != 3 {
		t.Fatalf("second take: %v; want the three ids", again)
	}
	if err := b.landed(again, TripReply{Acked: 3}); err != nil {
		t.Fatal(err)
	}
	if b.faults != 0 || c.Acked.Load() != 3 {
		t.Fatalf("after a sent batch: faults %d, acked %d; want 0, 3", b.faults, c.Acked.Load())
	}
	if ids := b.take(); ids != nil {
		t.Fatalf("take of no Acks: %v, want nil", ids)
	}
	if err := b.landed(nil, TripReply{AckErr: errors.New("a read failed, no Acks in it")}); err != nil {
		t.Fatalf("landed without Acks reported %v; want nil", err)
	}
}
