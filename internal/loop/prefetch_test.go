package loop

import (
	"strings"
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
		p := newPrefetch(100, 10*time.Millisecond, noByteBound)
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
	p := newPrefetch(100, 10*time.Millisecond, noByteBound)
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

func TestPrefetchfullBatches(t *testing.T) {
	p := newPrefetch(100, fullBatches, noByteBound)
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

// entryOf returns the fields of an entry whose names and values sum to size
// bytes.
func entryOf(size int) map[string]any {
	return map[string]any{"p": strings.Repeat("x", size-1)}
}

func TestPrefetchBoundsReadsInBytes(t *testing.T) {
	tests := []struct {
		name       string
		window     time.Duration
		maxBytes   int64
		size       int // each entry's size
		wantCount  int64
		wantBatch  int64
		wantBefore int64 // count before any entry was seen
	}{
		{"small entries read full batches", fullBatches, 8 << 20, 100, 100, 100, 1},
		{"256 KiB entries read four in 1 MiB", fullBatches, 1 << 20, 256 << 10, 4, 4, 1},
		{"entries above the bound read one", fullBatches, 1 << 20, 4 << 20, 1, 1, 1},
		{"the window still caps", 10 * time.Millisecond, 8 << 20, 100, 10, 100, 1},
		{"the byte bound caps below the window", 10 * time.Millisecond, 1 << 20, 256 << 10, 4, 4, 1},
		{"no byte bound", fullBatches, noByteBound, 4 << 20, 100, 100, 100},
	}
	t0 := time.Unix(0, 0)
	for _, tt := range tests {
		p := newPrefetch(100, tt.window, tt.maxBytes)
		if got := p.count(); got != tt.wantBefore {
			t.Errorf("%s: count before any entry = %d, want %d", tt.name, got, tt.wantBefore)
		}
		for range 20 {
			p.read(entryOf(tt.size))
			p.handedOver(t0)
			p.settled(t0.Add(time.Millisecond))
		}
		if got := p.count(); got != tt.wantCount {
			t.Errorf("%s: count = %d, want %d", tt.name, got, tt.wantCount)
		}
		if got := p.batch(); got != tt.wantBatch {
			t.Errorf("%s: batch = %d, want %d", tt.name, got, tt.wantBatch)
		}
	}
}

func TestPrefetchSizeFollowsTheEntries(t *testing.T) {
	p := newPrefetch(100, fullBatches, 1<<20)
	for range 50 {
		p.read(entryOf(1 << 20))
	}
	if got := p.count(); got != 1 {
		t.Fatalf("after 1 MiB entries: count = %d, want 1", got)
	}
	for range 100 {
		p.read(entryOf(1 << 10))
	}
	if got := p.count(); got != 100 {
		t.Fatalf("after 1 KiB entries: count = %d, want 100", got)
	}
}

func TestPrefetchReadDoesNotAllocate(t *testing.T) {
	p := newPrefetch(100, fullBatches, 1<<20)
	fields := map[string]any{"uuid": "abc", "payload": "0123456789", "n": int64(3)}
	if got := testing.AllocsPerRun(100, func() { p.read(fields) }); got != 0 {
		t.Errorf("allocations per read = %v, want 0", got)
	}
}

func TestPrefetchSettledWithin(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := newPrefetch(100, 10*time.Millisecond, noByteBound)
	if got := p.settledWithin(time.Millisecond); got != 0 {
		t.Fatalf("before any message: %d, want 0", got)
	}
	for range 20 {
		p.handedOver(t0)
		p.settled(t0.Add(100 * time.Microsecond))
	}
	if got := p.settledWithin(time.Millisecond); got != 10 {
		t.Errorf("100 µs a message, within 1 ms: %d, want 10", got)
	}
	if got := p.settledWithin(50 * time.Microsecond); got != 0 {
		t.Errorf("100 µs a message, within 50 µs: %d, want 0", got)
	}
}

// The values of valkeystream.NoReadAheadLimit and FullBatches.
const (
	noByteBound int64 = -1
	fullBatches       = time.Duration(-1)
)
