package soakledger

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRoundTripSkipsATornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	r := NewReader(path)
	if recs, err := r.Read(); err != nil || len(recs) != 0 {
		t.Fatalf("before the file exists: got %v, %v; want nothing", recs, err)
	}
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Began, "u1", "1-0", 1, ""); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Marked, "u1", "1-0", 1, "w0"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("H u2 2-0 1 17"); err != nil { // a writer killed mid-line
		t.Fatal(err)
	}
	_ = f.Close()

	recs, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("got %d records, want 2: %+v", len(recs), recs)
	}
	if got := recs[0]; got.Kind != Began || got.UUID != "u1" || got.EntryID != "1-0" || got.Count != 1 || got.At == 0 || got.Detail != "" {
		t.Errorf("first record: got %+v", got)
	}
	if got := recs[1]; got.Kind != Marked || got.Detail != "w0" || got.At < recs[0].At {
		t.Errorf("second record: got %+v, want a mark by w0 not stamped before the first", got)
	}
	if recs, err := r.Read(); err != nil || len(recs) != 0 {
		t.Errorf("read again: got %v, %v; want nothing (the torn line never counts)", recs, err)
	}
}

func TestWriteRefusesFieldsThatWouldBreakTheLine(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		name            string
		kind            byte
		uuid, id, extra string
	}{
		{"unknown kind", 'Z', "u", "1-0", ""},
		{"space in uuid", Began, "u 1", "1-0", ""},
		{"empty entry id", Began, "u", "", ""},
		{"newline in detail", Began, "u", "1-0", "a\nb"},
	} {
		if err := w.Write(c.kind, c.uuid, c.id, 1, c.extra); err == nil {
			t.Errorf("%s: got no error, want one", c.name)
		}
	}
}
