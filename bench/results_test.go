package main

import (
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{10, 10, 1}, 10},
	} {
		in := append([]float64(nil), tc.xs...)
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.xs[i] {
				t.Fatalf("median reordered its argument: %v", tc.xs)
			}
		}
	}
}

func TestRatio(t *testing.T) {
	if got := ratio(3, 2); got != 1.5 {
		t.Errorf("ratio(3, 2) = %v", got)
	}
	if got := ratio(3, 0); got != 0 {
		t.Errorf("ratio(3, 0) = %v, want 0 (unknown)", got)
	}
}

func TestResultsMedians(t *testing.T) {
	r := newResults()
	k := key{"consume-nack", sideValkeystream, 64, 0}
	for _, ms := range []int{100, 400, 200} { // 1000 messages each: 10000, 2500, 5000 msg/s
		r.add(k, sample{n: 1000, elapsed: time.Duration(ms) * time.Millisecond, tail: time.Duration(ms) * time.Microsecond, nacks: 10, duplicates: 1})
	}
	if got, ok := r.medianRate(k); !ok || got != 5000 {
		t.Errorf("medianRate = %v, %v; want 5000, true", got, ok)
	}
	if got := r.medianDuration(k, func(s sample) time.Duration { return s.tail }); got != 200*time.Microsecond {
		t.Errorf("median tail = %v, want 200µs", got)
	}
	if _, ok := r.medianRate(key{"consume-nack", sideIncumbent, 64, 0}); ok {
		t.Error("medianRate reports samples for a key that has none")
	}
	dup, _, nacks, _, messages := r.totals(k)
	if dup != 3 || nacks != 30 || messages != 3000 {
		t.Errorf("totals = %d duplicates, %d nacks, %d messages; want 3, 30, 3000", dup, nacks, messages)
	}
}

func TestRotate(t *testing.T) {
	xs := []string{"a", "b", "c"}
	for k, want := range []string{"abc", "bca", "cab", "abc"} {
		got := ""
		for _, x := range rotate(xs, k) {
			got += x
		}
		if got != want {
			t.Errorf("rotate(abc, %d) = %s, want %s", k, got, want)
		}
	}
	if xs[0] != "a" {
		t.Error("rotate changed its argument")
	}
}

func TestWidestSpread(t *testing.T) {
	r := newResults()
	if _, _, _, ok := r.widestSpread(); ok {
		t.Fatal("widestSpread found a spread in no results")
	}
	steady := key{"publish-batch", sideRaw, 64, 0}
	noisy := key{"publish-single", sideIncumbent, 16, 0}
	for _, ms := range []int{100, 110, 105} {
		r.add(steady, sample{n: 1000, elapsed: time.Duration(ms) * time.Millisecond})
	}
	for _, ms := range []int{100, 400, 200} {
		r.add(noisy, sample{n: 1000, elapsed: time.Duration(ms) * time.Millisecond})
	}
	k, lo, hi, ok := r.widestSpread()
	if !ok || k != noisy || lo != 2500 || hi != 10000 {
		t.Errorf("widestSpread = %v, %v, %v, %v; want %v, 2500, 10000, true", k, lo, hi, ok, noisy)
	}
}
