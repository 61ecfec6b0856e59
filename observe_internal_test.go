package valkeystream

import (
	"strconv"
	"testing"
	"time"
)

func TestEntryMillis(t *testing.T) {
	for _, tc := range []struct {
		id     string
		want   int64
		wantOK bool
	}{
		{"1700000000000-0", 1700000000000, true},
		{"1700000000000-12", 1700000000000, true},
		{"0-1", 0, true},
		{"42", 42, true}, // an id without its sequence part
		{"", 0, false},
		{"-1", 0, false},
		{"17x0-0", 0, false},
		{"99999999999999999999-0", 0, false}, // beyond int64
	} {
		got, ok := entryMillis(tc.id)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("entryMillis(%q) = %d, %v; want %d, %v", tc.id, got, ok, tc.want, tc.wantOK)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = entryMillis("1700000000000-0") }); n != 0 {
		t.Errorf("entryMillis allocates %v times, want 0", n)
	}
}

type recordingObserver struct {
	stream, group string
	age           time.Duration
	calls         int
}

func (r *recordingObserver) ObserveDelivery(stream, group string, age time.Duration) {
	r.stream, r.group, r.age = stream, group, age
	r.calls++
}

func TestDeliveryHook(t *testing.T) {
	var h deliveryHook
	h.delivered("s", "g", "1-0") // no observer: nothing happens
	if n := testing.AllocsPerRun(100, func() { h.delivered("s", "g", "1700000000000-0") }); n != 0 {
		t.Errorf("a delivery without an observer allocates %v times, want 0", n)
	}

	var s Subscriber
	r := &recordingObserver{}
	s.SetDeliveryObserver(r)
	past := time.Now().Add(-time.Minute).UnixMilli()
	s.observe.delivered("orders", "billing", itoa(past)+"-3")
	if r.calls != 1 || r.stream != "orders" || r.group != "billing" {
		t.Fatalf("observed %d calls, last %q %q; want 1 for orders billing", r.calls, r.stream, r.group)
	}
	if r.age < time.Minute || r.age > 2*time.Minute {
		t.Errorf("age %s, want about a minute", r.age)
	}
	s.observe.delivered("orders", "billing", itoa(time.Now().Add(time.Hour).UnixMilli())+"-0")
	if r.age != 0 {
		t.Errorf("age of an id ahead of the clock %s, want 0", r.age)
	}
	s.observe.delivered("orders", "billing", "not-an-id")
	if r.calls != 2 {
		t.Errorf("%d calls after an unreadable id, want 2 (it is not observed)", r.calls)
	}
	s.SetDeliveryObserver(nil)
	s.observe.delivered("orders", "billing", "1-0")
	if r.calls != 2 {
		t.Errorf("%d calls after the observer was removed, want 2", r.calls)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
