// Package audit is the ledger of the crash audits: a process that handles
// messages appends one line per step to a file of its own, and the test reads
// every file back to prove that each published message was handled.
//
// A line is written with a single write(2) on a file opened with O_APPEND, and
// it is written before the message is acknowledged. Once write returns, the
// line is in the kernel's page cache and survives a SIGKILL of the writer at
// any later instant (only a crash of the whole machine could lose it, which
// is not what these audits simulate, so no fsync is needed). A SIGKILL during
// the write itself can leave at most the last line of a file without its
// newline: the [Reader] never counts such a torn line.
//
// Line format, fields separated by one space:
//
//	B <uuid> <entry id> <delivery count>   the handler began with the message
//	H <uuid> <entry id> <delivery count>   the handler finished; the Ack follows
//	M <uuid> <entry id> <delivery count>   marked done (deduplicating workers)
//	R <uuid> <entry id> <delivery count>   the handler asked for a retry (Nack); no H follows
//
// A keyed line (written by [Writer.Keyed], by the workers of the partitioned
// crash audit) carries three more fields: the wall clock of the write in
// Unix nanoseconds, the message's partition key and its sequence number
// within the key:
//
//	B <uuid> <entry id> <delivery count> <unix ns> <key> <seq>
package audit

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Kinds of ledger lines.
const (
	// Began: the handler received the message and starts working on it.
	Began = 'B'
	// Handled: the handler finished with the message; it is Acked next.
	Handled = 'H'
	// Marked: a deduplicating handler recorded the message as done in the
	// server after it was handled (written only by workers that
	// deduplicate).
	Marked = 'M'
	// Retried: the handler asked for the message to come back (a Nack
	// with a retry-after); no Handled line follows for this delivery.
	Retried = 'R'
)

// Writer appends lines to one ledger file. It is not safe for concurrent use.
type Writer struct {
	f   *os.File
	buf []byte
}

// Create creates the ledger file at path, which must not exist yet.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return &Writer{f: f}, nil
}

// Begin records that the handler received the message.
func (w *Writer) Begin(uuid, entryID string, count int) error {
	return w.line(Began, uuid, entryID, count)
}

// Handled records that the handler finished with the message. Call it before
// the Ack.
func (w *Writer) Handled(uuid, entryID string, count int) error {
	return w.line(Handled, uuid, entryID, count)
}

func (w *Writer) line(kind byte, uuid, entryID string, count int) error {
	return w.write(kind, uuid, entryID, count, nil)
}

// keyed is what a keyed line adds.
type keyed struct {
	key string
	seq int
}

// Keyed writes a line of kind (Began, Handled, Marked or Retried) for a
// message with a partition key and a sequence number within the key,
// stamped with the wall clock (time.Now, in Unix nanoseconds) just before
// the write.
func (w *Writer) Keyed(kind byte, uuid, entryID string, count int, key string, seq int) error {
	if !strings.ContainsRune(kinds, rune(kind)) {
		return fmt.Errorf("audit: unknown line kind %q", kind)
	}
	if key == "" || strings.ContainsAny(key, " \n") {
		return fmt.Errorf("audit: key %q is empty or contains a space or a newline", key)
	}
	return w.write(kind, uuid, entryID, count, &keyed{key: key, seq: seq})
}

func (w *Writer) write(kind byte, uuid, entryID string, count int, k *keyed) error {
	if strings.ContainsAny(uuid, " \n") || strings.ContainsAny(entryID, " \n") {
		return fmt.Errorf("audit: uuid %q or entry id %q contains a space or a newline", uuid, entryID)
	}
	b := w.buf[:0]
	b = append(b, kind, ' ')
	b = append(b, uuid...)
	b = append(b, ' ')
	b = append(b, entryID...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(count), 10)
	if k != nil {
		b = append(b, ' ')
		b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
		b = append(b, ' ')
		b = append(b, k.key...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(k.seq), 10)
	}
	b = append(b, '\n')
	w.buf = b
	// One write call: the line is either wholly in the file or (if the
	// process dies inside the call) possibly torn at the very end.
	n, err := w.f.Write(b)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("audit: writing %s: %w", w.f.Name(), err)
	}
	return nil
}

// Marked records that the message was marked done in the server after it
// was handled. Call it after the mark, before the Ack.
func (w *Writer) Marked(uuid, entryID string, count int) error {
	return w.line(Marked, uuid, entryID, count)
}

// Retried records that the handler asked for the message to come back.
func (w *Writer) Retried(uuid, entryID string, count int) error {
	return w.line(Retried, uuid, entryID, count)
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Record is one complete ledger line.
type Record struct {
	Kind    byte // Began, Handled, Marked or Retried
	UUID    string
	EntryID string
	Count   int // the delivery count the message carried

	// Of a keyed line only (Keyed is true): the wall clock of the write in
	// Unix nanoseconds, the message's key and its sequence number.
	Keyed bool
	At    int64
	Key   string
	Seq   int
}

// Reader reads a ledger file incrementally, while its writer may still be
// appending to it: each call to Read returns the complete lines added since
// the previous call.
type Reader struct{ lines *Lines }

// NewReader returns a Reader of the ledger file at path. The file need not
// exist yet.
func NewReader(path string) *Reader { return &Reader{lines: NewLines(path)} }

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
		return recs, fmt.Errorf("audit: %w", err)
	}
	return recs, nil
}

// Torn returns the bytes after the last complete line seen by Read: a line
// whose writer died during the write (or is writing it now). It never counts.
func (r *Reader) Torn() []byte { return r.lines.Torn() }

// kinds are the kinds of lines.
const kinds = "BHMR"

func parse(line []byte) (Record, error) {
	f := strings.Fields(string(line))
	if (len(f) != 4 && len(f) != 7) || len(f[0]) != 1 || !strings.ContainsRune(kinds, rune(f[0][0])) {
		return Record{}, fmt.Errorf("malformed line %q", line)
	}
	n, err := strconv.Atoi(f[3])
	if err != nil || n < 0 {
		return Record{}, fmt.Errorf("malformed delivery count in line %q", line)
	}
	r := Record{Kind: f[0][0], UUID: f[1], EntryID: f[2], Count: n}
	if len(f) == 7 {
		r.Keyed, r.Key = true, f[5]
		if r.At, err = strconv.ParseInt(f[4], 10, 64); err != nil {
			return Record{}, fmt.Errorf("malformed time in line %q", line)
		}
		if r.Seq, err = strconv.Atoi(f[6]); err != nil {
			return Record{}, fmt.Errorf("malformed sequence number in line %q", line)
		}
	}
	return r, nil
}
