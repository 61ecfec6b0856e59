package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// printJSON writes v as indented JSON.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns.
type table struct{ w *tabwriter.Writer }

func (e *env) table(header ...string) *table {
	t := &table{w: tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(c)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

// idTime returns the time in a stream entry id ("<ms>-<seq>"), or the zero
// time when id is not one.
func idTime(id string) time.Time {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return time.Time{}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

// timeText formats t for a table, "-" for the zero time.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format("2006-01-02 15:04:05.000Z")
}

// ageText formats a duration for a table: whole milliseconds below a
// second, then at most two units.
func ageText(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	default:
		days := d / (24 * time.Hour)
		return fmt.Sprintf("%dd%dh", days, (d-days*24*time.Hour)/time.Hour)
	}
}

// preview returns the first n bytes of b as readable text: quoted when it is
// not printable UTF-8, with the length when cut.
func preview(b string, n int) string {
	cut := b
	if n >= 0 && len(cut) > n {
		cut = cut[:n]
		for len(cut) > 0 && utf8.ValidString(b) && !utf8.ValidString(cut) {
			cut = cut[:len(cut)-1] // do not split a rune
		}
	}
	s := cut
	if !printable(cut) {
		s = strconv.Quote(cut)
	}
	if len(cut) < len(b) {
		s += fmt.Sprintf("... (%d bytes)", len(b))
	}
	return s
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 && r != '\n' && r != '\t' || r == 0x7f {
			return false
		}
	}
	return true
}

// clip shortens s to n runes for a table cell.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-3]) + "..."
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// note writes a remark for the person at the terminal on stderr, so that
// stdout stays the data.
func (e *env) note(format string, args ...any) {
	fmt.Fprintf(e.stderr, format+"\n", args...)
}
