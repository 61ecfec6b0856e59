package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100) // 1..100 ms
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"none", nil, 50, 0},
		{"one", []time.Duration{7}, 99, 7},
		{"median of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p100 of 1..100", hundred, 100, 100 * time.Millisecond},
		{"p1 of 1..100", hundred, 1, 1 * time.Millisecond},
		{"p99 of ten is the largest", hundred[:10], 99, 10 * time.Millisecond},
		{"p50 of four is the second", []time.Duration{1, 2, 3, 4}, 50, 2},
		{"p50 of five is the third", []time.Duration{1, 2, 3, 4, 5}, 50, 3},
		{"a tiny p is the smallest", []time.Duration{1, 2, 3}, 0.001, 1},
	} {
		if got := percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: percentile(p%v) = %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
}

func TestSummarizeSortsAndTakesTheMax(t *testing.T) {
	ds := []time.Duration{9, 1, 5, 3, 7}
	got := summarize(ds)
	want := latencyStats{n: 5, p50: 5, p99: 9, max: 9}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
	if zero := summarize(nil); zero != (latencyStats{}) {
		t.Errorf("summarize(nil) = %+v, want zeros", zero)
	}
}

func TestLatencyBook(t *testing.T) {
	c, err := newCorpus(1, 3, latencySize)
	if err != nil {
		t.Fatal(err)
	}
	book := newLatencyBook(c)
	published := time.Unix(100, 0)
	stamped := func(i int) *message.Message {
		msg := c.message(i)
		msg.Metadata.Set(publishedAtKey, strconv.FormatInt(published.UnixNano(), 10))
		return msg
	}
	book.handle(stamped(0), published.Add(3*time.Millisecond))
	book.handle(stamped(1), published.Add(1*time.Millisecond))
	book.handle(stamped(1), published.Add(9*time.Millisecond)) // a redelivery: not booked again
	book.handle(c.message(2), published)                       // no publish time
	select {
	case <-book.done:
		t.Fatal("the book is done with one message never handled")
	default:
	}
	book.handle(stamped(2), published.Add(2*time.Millisecond))
	select {
	case <-book.done:
	default:
		t.Fatal("the book is not done after every message was handled")
	}
	if got, want := book.stats(), (latencyStats{n: 3, p50: 2 * time.Millisecond, p99: 3 * time.Millisecond, max: 3 * time.Millisecond}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	if d, i := book.dups.Load(), book.invalid.Load(); d != 1 || i != 1 {
		t.Errorf("got %d duplicates and %d invalid deliveries, want 1 and 1", d, i)
	}
}

func TestParseDurations(t *testing.T) {
	got, err := parseDurations("0, 1ms,2.5ms")
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{0, time.Millisecond, 2500 * time.Microsecond}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("parseDurations = %v, want %v", got, want)
	}
	if got, err := parseDurations(""); err != nil || len(got) != 1 || got[0] != 0 {
		t.Errorf("parseDurations(\"\") = %v, %v; want [0] (loopback)", got, err)
	}
	for _, bad := range []string{"1", "-1ms", "1ms,1ms", "fast"} {
		if _, err := parseDurations(bad); err == nil {
			t.Errorf("parseDurations(%q) accepted it", bad)
		}
	}
}
