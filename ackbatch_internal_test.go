package valkeystream

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

func TestAckBatchIsDueAfterItsInterval(t *testing.T) {
	b := newAckBatch(50 * time.Millisecond)
	if b.due() != nil {
		t.Fatal("an empty batch has a due channel, want nil")
	}
	b.add("1-0")
	b.add("2-0")
	if got := b.len(); got != 2 {
		t.Fatalf("len is %d, want 2", got)
	}
	if !fired(b.due(), 10*time.Second) {
		t.Fatal("the batch never came due")
	}
}

func TestAckBatchAtOnceIsDueAtOnce(t *testing.T) {
	b := newAckBatch(-1)
	if !b.atOnce() {
		t.Fatal("atOnce is false for a negative interval")
	}
	b.add("1-0")
	// At once: due without waiting an interval (a generous bound, never a
	// speed requirement).
	if !fired(b.due(), 10*time.Second) {
		t.Fatal("the batch never came due")
	}
}

func TestAckBatchSettle(t *testing.T) {
	b := newAckBatch(time.Hour)
	b.add("1-0")
	b.add("2-0")

	failed := redis.NewIntCmd(nil)
	failed.SetErr(errors.New("connection reset"))
	if _, err := b.settle(failed); err == nil {
		t.Fatal("settle of a failed XACK returned no error")
	}
	if got := b.failed(); got != 1 {
		t.Fatalf("failed returned %d, want 1", got)
	}
	if got := b.failed(); got != 2 {
		t.Fatalf("failed returned %d, want 2", got)
	}
	if !slices.Equal(b.ids, []string{"1-0", "2-0"}) {
		t.Fatalf("ids after a failed send are %v, want both kept", b.ids)
	}

	ok := redis.NewIntCmd(nil)
	ok.SetVal(1)
	n, err := b.settle(ok)
	if err != nil || n != 1 {
		t.Fatalf("settle = %d, %v, want 1, nil", n, err)
	}
	if b.len() != 0 || b.due() != nil || b.faults != 0 {
		t.Fatalf("after a sent batch: len %d, due %v, faults %d, want 0, nil, 0", b.len(), b.due(), b.faults)
	}
}

func TestAckBatchWaitFollowsTheHandler(t *testing.T) {
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
		{"at once stays at once", AckAtOnce, 5 * time.Millisecond, AckAtOnce},
	}
	for _, tt := range tests {
		b := newAckBatch(tt.every)
		b.pace(tt.settle)
		if b.wait != tt.want {
			t.Errorf("%s: wait = %s, want %s", tt.name, b.wait, tt.want)
		}
	}
}

func TestAckBatchSendTakenAndSettleTaken(t *testing.T) {
	b := newAckBatch(time.Hour)
	b.add("1-0")
	b.add("2-0")
	// Queued on a pipeline that is never sent: only the batch is under test.
	pipe := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}).Pipeline()
	taken, cmd := b.sendTaken(context.Background(), pipe, "s", "g")
	if !slices.Equal(taken, []string{"1-0", "2-0"}) || cmd == nil {
		t.Fatalf("sendTaken: %v, %v; want both ids and their XACK", taken, cmd)
	}
	if b.len() != 0 || b.due() != nil {
		t.Fatalf("after sendTaken: len %d, due %v; want an empty batch with nothing due", b.len(), b.due())
	}
	b.add("3-0") // made while the taken ones are on their way
	cmd.SetErr(errors.New("connection reset"))
	if _, err := b.settleTaken(taken, cmd); err == nil {
		t.Fatal("settleTaken of a failed XACK returned no error")
	}
	if got := b.ids; !slices.Equal(got, []string{"1-0", "2-0", "3-0"}) {
		t.Fatalf("after a failed send: %v, want the taken ids ahead of the new one", got)
	}
	if b.faults != 1 {
		t.Fatalf("a failed send counted %d failures, want 1", b.faults)
	}
	if !fired(b.due(), 10*time.Second) {
		t.Fatal("restored ids never came due again")
	}
	if ids, cmd := b.sendTaken(context.Background(), pipe, "s", "g"); len(ids) != 3 || cmd == nil {
		t.Fatalf("second sendTaken: %v; want the three ids", ids)
	}
	if ids, cmd := b.sendTaken(context.Background(), pipe, "s", "g"); ids != nil || cmd != nil {
		t.Fatal("sendTaken of an empty batch queued an XACK")
	}
}
