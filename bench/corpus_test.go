package main

import (
	"context"
	"regexp"
	"testing"
	"time"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestCorpusIsDeterministic(t *testing.T) {
	a, err := newCorpus(42, 1000, 16)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newCorpus(42, 1000, 16)
	other, _ := newCorpus(43, 1000, 16)
	seen := map[string]bool{}
	for i := range a.n {
		u := a.uuid(i)
		if !uuidPattern.MatchString(u) {
			t.Fatalf("uuid(%d) = %q, not a version 4 UUID", i, u)
		}
		if seen[u] {
			t.Fatalf("uuid(%d) = %q repeats", i, u)
		}
		seen[u] = true
		if u != b.uuid(i) || string(a.payload(i)) != string(b.payload(i)) {
			t.Fatalf("message %d differs between two corpora of the same seed", i)
		}
		if u == other.uuid(i) {
			t.Fatalf("message %d has the same UUID under another seed", i)
		}
	}
}

func TestPayloadCarriesSequence(t *testing.T) {
	c, _ := newCorpus(1, 70000, 64)
	for _, i := range []int{0, 1, 9, 10, 255, 65535, 69999} {
		p := c.payload(i)
		if len(p) != 64 {
			t.Fatalf("payload(%d) has %d bytes, want 64", i, len(p))
		}
		if got, ok := parseSeq(p); !ok || got != i {
			t.Errorf("parseSeq(payload(%d)) = %d, %v", i, got, ok)
		}
		if got, ok := parseSeq(string(p)); !ok || got != i {
			t.Errorf("parseSeq(string(payload(%d))) = %d, %v", i, got, ok)
		}
	}
	for _, bad := range []string{"", "0000001", "0000000g", "ZZZZZZZZ-rest"} {
		if _, ok := parseSeq(bad); ok {
			t.Errorf("parseSeq(%q) accepted it", bad)
		}
	}
	msg := c.message(5)
	if msg.Metadata.Get(metadataKey) != c.correlationID(5) || len(c.correlationID(5)) != 22 {
		t.Errorf("message 5 has metadata %v", msg.Metadata)
	}
}

func TestNewCorpusRejects(t *testing.T) {
	if _, err := newCorpus(1, 10, seqDigits-1); err == nil {
		t.Error("a payload too small for the sequence number was accepted")
	}
	if _, err := newCorpus(1, 0, 16); err == nil {
		t.Error("an empty corpus was accepted")
	}
}

func TestNackFirstPicksAboutOneInHundred(t *testing.T) {
	c, _ := newCorpus(7, 100000, 16)
	picked := 0
	for i := range c.n {
		if nackFirst(c.uuid(i)) {
			picked++
		}
	}
	if picked < 800 || picked > 1200 {
		t.Errorf("nackFirst picked %d of 100000, want about 1000", picked)
	}
}

func TestTrackerBooks(t *testing.T) {
	c, _ := newCorpus(3, 3, 16)
	tr := newTracker(c, true)
	tr.begin()
	for i := range 3 {
		seq, first, ok := deliver(tr, c.payload(i))
		if !ok || !first || seq != i {
			t.Fatalf("deliver(payload(%d)) = %d, %v, %v", i, seq, first, ok)
		}
	}
	tr.nack(1)
	if _, first, _ := deliver(tr, c.payload(1)); first {
		t.Error("a redelivery was booked as a first delivery")
	}
	tr.succeed(0)
	tr.succeed(0) // a duplicate
	tr.succeed(1)
	if _, _, ok := deliver(tr, []byte("ffffffff-not-from-the-corpus")); ok {
		t.Error("a foreign payload was accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := tr.wait(ctx, 100*time.Millisecond); err == nil {
		t.Fatal("wait returned nil with a message missing")
	}
	tr.succeed(2)
	if err := tr.wait(ctx, time.Second); err == nil {
		t.Error("wait returned nil after a foreign delivery")
	}
	if d := tr.duplicates.Load(); d != 1 {
		t.Errorf("duplicates = %d, want 1", d)
	}
	if n := tr.redeliveries.Load(); n != 1 {
		t.Errorf("redeliveries = %d, want 1", n)
	}
	if tr.nacked.Load() != 1 || tr.delivered.Load() != 4 {
		t.Errorf("nacked %d, delivered %d; want 1, 4", tr.nacked.Load(), tr.delivered.Load())
	}
}

func TestFillBatchBoundsBytes(t *testing.T) {
	for _, tc := range []struct{ size, want int }{{64, 1000}, {65536, 128}, {1 << 20, 8}, {64 << 20, 1}} {
		c, err := newCorpus(1, 10, tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.fillBatch(); got != tc.want {
			t.Errorf("fillBatch for %d-byte payloads = %d, want %d", tc.size, got, tc.want)
		}
	}
}
