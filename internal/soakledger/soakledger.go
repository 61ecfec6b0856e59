// Package soakledger is the second ledger of the chaos soak's workers
// (internal/soakworker, soak_test.go): the lines of the plain consumer
// group and of the fan-out subscription. The lines of the partitioned
// transform go to an internal/audit ledger, which the partitioned crash
// audit's judge reads.
//
// As in internal/audit, a line is written with a single write(2) on a file
// opened with O_APPEND, before the step it records is acknowledged, so it
// survives a SIGKILL of the writer at any later instant; a SIGKILL during
// the write can tear the last line only, which the [Reader] never counts.
//
// A line is six fields separated by one space:
//
//	<kind> <uuid> <entry id> <delivery count> <unix ns> <detail>
//
// where the time is the wall clock (time.Now) at the write, and the detail
// is "-" or a word without spaces (the consumer name of a mark line).
package soakledger

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/echomq/valkeystream/internal/audit"
)

// Kinds of lines.
const (
	// Began: the plain group's handler received the message.
	Began = 'B'
	// Handled: the handler finished the message successfully.
	Handled = 'H'
	// Retried: the handler asked for the message to come back later
	// (valkeystream.RetryAfter); no Handled line follows for this delivery.
	Retried = 'R'
	// Failed: the handler failed the message (a poison message not fixed
	// yet); no Handled line follows for this delivery.
	Failed = 'F'
	// Marked: the Deduplicator marked the message done after this
	// delivery's handling, with its in-progress mark intact.
	Marked = 'M'
	// MarkedLate: the Deduplicator marked the message done after this
	// delivery's handling, but found its in-progress mark expired or
	// replaced (DedupStats.LostMarks): another delivery may have run.
	MarkedLate = 'L'
	// GivenUp: the DeadLetter middleware published the message to the
	// dead-letter topic on this delivery (DedupStats.GivenUp).
	GivenUp = 'D'
	// Seen: the fan-out subscription received the entry.
	Seen = 'S'
)

const kinds = "BHRFMLDS"

// Writer appends lines to one ledger file. It is safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
}

// Create creates the ledger file at path, which must not exist yet.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("soakledger: %w", err)
	}
	return &Writer{f: f}, nil
}

// Write appends a line of kind for the message uuid delivered as entry
// entryID with the delivery count count, stamped with the wall clock just
// before the write. detail may be empty.
func (w *Writer) Write(kind byte, uuid, entryID string, count int, detail string) error {
	if !strings.ContainsRune(kinds, rune(kind)) {
		return fmt.Errorf("soakledger: unknown line kind %q", kind)
	}
	if detail == "" {
		detail = "-"
	}
	for _, f := range []string{uuid, entryID, detail} {
		if f == "" || strings.ContainsAny(f, " \n") {
			return fmt.Errorf("soakledger: field %q is empty or contains a space or a newline", f)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], kind, ' ')
	b = append(b, uuid...)
	b = append(b, ' ')
	b = append(b, entryID...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(count), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
	b = append(b, ' ')
	b = append(b, detail...)
	b = append(b, '\n')
	w.buf = b
	n, err := w.f.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("soakledger: writing %s: %w", w.f.Name(), err)
	}
	return nil
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Record is one complete line.
type Record struct {
	Kind    byte
	UUID    string
	EntryID string
	Count   int
	At      int64  // wall clock of the write, Unix nanoseconds
	Detail  string // "" for "-"
}

// Reader reads a ledger file incrementally, while its writer may still be
// appending to it: each call to Read returns the complete lines added since
// the previous call.
type Reader struct{ lines *audit.Lines }

// NewReader returns a Reader of the ledger file at path. The file need not
// exist yet.
func NewReader(path string) *Reader { return &Reader{lines: audit.NewLines(path)} }

// Path is the file the Reader reads.
func (r *Reader) Path() string { return r.lines.Path() }

// Read returns the complete lines appended since the last call. A malformed
// complete line is an error: only the last line of a file may be torn, and
// it has no newline.
func (r *Reader) Read() ([]Record, error) {
	var recs []Record
	err := r.lines.Read(func(line []byte) error {
		rec, err := parse(line)
		if err == nil {
			recs = append(recs, rec)
		}
		return err
	})
	if err != nil {
		return recs, fmt.Errorf("soakledger: %w", err)
	}
	return recs, nil
}

func parse(line []byte) (Record, error) {
	f := strings.Fields(string(line))
	if len(f) != 6 || len(f[0]) != 1 || !strings.ContainsRune(kinds, rune(f[0][0])) {
		return Record{}, fmt.Errorf("malformed line %q", line)
	}
	count, err := strconv.Atoi(f[3])
	if err != nil || count < 0 {
		return Record{}, fmt.Errorf("malformed delivery count in line %q", line)
	}
	at, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil {
		return Record{}, fmt.Errorf("malformed time in line %q", line)
	}
	rec := Record{Kind: f[0][0], UUID: f[1], EntryID: f[2], Count: count, At: at, Detail: f[5]}
	if rec.Detail == "-" {
		rec.Detail = ""
	}
	return rec, nil
}
