package valkeystream

import (
	"testing"
	"time"
)

func TestPrefetchFollowsTheHandler(t *testing.T) {
	t0 := time.Unix(0, 0)
	settleAll := func(p *prefetch, d time.Duration, n int) {
		for range n {
			p.handedOver(t0)
			p.settled(t0.Add(d))
		}
	}
	tests := []struct {
		name   string
		handle time.Duration // each message's time in the handler
		want   int64
	}{
		{"fast handler reads full batches", 50 * time.Microsecond, 100},
		{"1 ms handler reads ten", time.Millisecond, 10},
		{"10 ms handler reads one", 10 * time.Millisecond, 1},
		{"100 ms handler reads one", 100 * time.Millisecond, 1},
		{"a handler slower than the window reads one", 2 * time.Second, 1},
	}
	for _, tt := range tests {
		p := newPrefetch(100, 10*time.Millisecond)
		if got := p.count(); got != 1 {
			t.Fatalf("%s: count before any message = %d, want 1", tt.name, got)
		}
		settleAll(&p, tt.handle, 20)
		if got := p.count(); got != tt.want {
			t.Errorf("%s: count = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestPrefetchAdaptsBothWays(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := newPrefetch(100, 10*time.Millisecond)
	for range 20 {
		p.handedOver(t0)
		p.settled(t0.Add(100 * time.Millisecond))
	}
	if got := p.count(); got != 1 {
		t.Fatalf("slow: count = %d, want 1", got)
	}
	for range 40 {
		p.handedOver(t0)
		p.settled(t0.Add(time.Microsecond))
	}
	if got := p.count(); got != 100 {
		t.Fatalf("fast again: count = %d, want 100", got)
	}
}

func TestPrefetchFullBatches(t *testing.T) {
	p := newPrefetch(100, FullBatches)
	if got := p.count(); got != 100 {
		t.Fatalf("count before any message = %d, want 100", got)
	}
	t0 := time.Unix(0, 0)
	p.handedOver(t0)
	p.settled(t0.Add(time.Second))
	if got := p.count(); got != 100 {
		t.Fatalf("count after a slow message = %d, want 100", got)
	}
}
