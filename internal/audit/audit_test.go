package audit

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLedgerRoundTripIgnoresATornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	r := NewReader(path)
	recs, err := r.Read()
	if err != nil || len(recs) != 0 {
		t.Fatalf("before the file exists: %v, %v", recs, err)
	}
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Begin("u1", "1-0", 1); err != nil {
		t.Fatal(err)
	}
	if err := w.Handled("u1", "1-0", 1); err != nil {
		t.Fatal(err)
	}
	recs, err = r.Read()
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{{Kind: Began, UUID: "u1", EntryID: "1-0", Count: 1}, {Kind: Handled, UUID: "u1", EntryID: "1-0", Count: 1}}
	if len(recs) != 2 || recs[0] != want[0] || recs[1] != want[1] {
		t.Fatalf("got %+v, want %+v", recs, want)
	}
	if err := w.Handled("u2", "2-0", 3); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// A writer killed in the middle of a line.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("H u3 3-"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	recs, err = r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0] != (Record{Kind: Handled, UUID: "u2", EntryID: "2-0", Count: 3}) {
		t.Fatalf("got %+v, want only u2", recs)
	}
	if string(r.Torn()) != "H u3 3-" {
		t.Fatalf("torn bytes %q", r.Torn())
	}
	if recs, err := r.Read(); err != nil || len(recs) != 0 {
		t.Fatalf("nothing new: got %v, %v", recs, err)
	}
	if _, err := Create(path); err == nil {
		t.Fatal("Create must refuse an existing file")
	}
}

func TestMalformedCompleteLineIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if err := os.WriteFile(path, []byte("H u1 1-0 1\nX nonsense\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := NewReader(path).Read()
	if err == nil {
		t.Fatal("want an error for a malformed complete line")
	}
	if len(recs) != 1 {
		t.Fatalf("the good line before it is returned: %+v", recs)
	}
}

func TestMarkedLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Marked("u1", "1-0", 2); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	recs, err := NewReader(path).Read()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Record{Kind: Marked, UUID: "u1", EntryID: "1-0", Count: 2}); len(recs) != 1 || recs[0] != want {
		t.Fatalf("got %+v, want [%+v]", recs, want)
	}
}

func TestKeyedAndRetriedLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixNano()
	if err := w.Keyed(Began, "u1", "1-0", 1, "key-7", 42); err != nil {
		t.Fatal(err)
	}
	if err := w.Retried("u1", "1-0", 1); err != nil {
		t.Fatal(err)
	}
	if err := w.Keyed(Handled, "u1", "1-0", 2, "key-7", 42); err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixNano()
	if err := w.Keyed(Handled, "u1", "1-0", 2, "a key", 1); err == nil {
		t.Fatal("want an error for a key with a space")
	}
	if err := w.Keyed('X', "u1", "1-0", 2, "k", 1); err == nil {
		t.Fatal("want an error for an unknown kind")
	}
	_ = w.Close()
	recs, err := NewReader(path).Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("got %+v, want 3 lines", recs)
	}
	if r := recs[0]; !r.Keyed || r.Kind != Began || r.Key != "key-7" || r.Seq != 42 || r.At < before || r.At > after {
		t.Fatalf("keyed line %+v (written between %d and %d)", r, before, after)
	}
	if want := (Record{Kind: Retried, UUID: "u1", EntryID: "1-0", Count: 1}); recs[1] != want {
		t.Fatalf("got %+v, want %+v", recs[1], want)
	}
	if r := recs[2]; r.Kind != Handled || r.Count != 2 || r.At < recs[0].At {
		t.Fatalf("second keyed line %+v", r)
	}
}
