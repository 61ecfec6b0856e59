package main

import (
	"testing"
	"time"
)

func TestAgeText(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "-"},
		{1500 * time.Microsecond, "2ms"},
		{12340 * time.Millisecond, "12.3s"},
		{75 * time.Second, "1m15s"},
		{3*time.Hour + 20*time.Minute + 10*time.Second, "3h20m0s"},
		{50 * time.Hour, "2d2h"},
	}
	for _, tc := range tests {
		if got := ageText(tc.d); got != tc.want {
			t.Errorf("ageText(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestPreview(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"hello", 10, "hello"},
		{"hello world", 5, "hello... (11 bytes)"},
		{"héllo", 2, "h... (6 bytes)"}, // does not split a rune
		{"a\x00b", -1, `"a\x00b"`},
		{"\xff\xfe", 1, `"\xff"... (2 bytes)`},
	}
	for _, tc := range tests {
		if got := preview(tc.in, tc.n); got != tc.want {
			t.Errorf("preview(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestIDTime(t *testing.T) {
	if got := idTime("1700000000123-4"); !got.Equal(time.UnixMilli(1700000000123)) {
		t.Errorf("idTime = %v, want %v", got, time.UnixMilli(1700000000123))
	}
	for _, bad := range []string{"", "nope", "x-1", "0-1"} {
		if got := idTime(bad); !got.IsZero() {
			t.Errorf("idTime(%q) = %v, want the zero time", bad, got)
		}
	}
}
