package audit

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// Lines reads a file of lines incrementally, while its writer may still be
// appending to it: each call to Read hands over the complete lines added
// since the previous call. Only the last line of a file may be torn (no
// newline yet): it is kept until it is complete.
type Lines struct {
	path    string
	off     int64  // bytes consumed, up to the end of the last complete line
	partial []byte // bytes after the last newline seen so far
}

// NewLines returns the Lines of the file at path, which need not exist yet.
func NewLines(path string) *Lines { return &Lines{path: path} }

// Path is the file read.
func (l *Lines) Path() string { return l.path }

// Torn returns the bytes after the last complete line seen by Read.
func (l *Lines) Torn() []byte { return l.partial }

// Read calls line with each complete line appended since the last call
// (without its newline) and its offset in the file, and stops at the first
// error line returns, which it returns naming the file and the offset.
func (l *Lines) Read(line func(b []byte) error) error {
	f, err := os.Open(l.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, l.off+int64(len(l.partial)), 1<<62))
	if err != nil {
		return fmt.Errorf("reading %s: %w", l.path, err)
	}
	data = append(l.partial, data...)
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		l.partial = data
		return nil
	}
	complete := data[:end+1]
	l.partial = append([]byte(nil), data[end+1:]...)
	at := l.off
	l.off += int64(len(complete))
	for len(complete) > 0 {
		i := bytes.IndexByte(complete, '\n')
		if err := line(complete[:i]); err != nil {
			return fmt.Errorf("%s at byte %d: %w", l.path, at, err)
		}
		at += int64(i + 1)
		complete = complete[i+1:]
	}
	return nil
}
