package delay

import (
	"slices"
	"testing"
)

func TestDelayedEntryEncoding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields []any
		want   string
	}{
		{"none", nil, ""},
		{"strings and bytes", []any{"uuid", "u-1", "payload", []byte("a:b\n")}, "4:uuid3:u-17:payload4:a:b\n"},
		{"empty value", []any{"k", ""}, "1:k0:"},
		{"numbers and booleans", []any{"i", 7, "n", int64(-12), "f", 1.5, "t", true, "o", false}, "1:i1:71:n3:-121:f3:1.51:t1:11:o1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EncodeEntry(tc.fields)
			if err != nil || got != tc.want {
				t.Fatalf("EncodeEntry(%q) = %q, %v; want %q, nil", tc.fields, got, err, tc.want)
			}
		})
	}
	if got, err := EncodeEntry([]any{"k", struct{}{}}); err == nil {
		t.Fatalf("EncodeEntry of a struct field = %q, nil; want an error", got)
	}
}

func TestDecodeEntryReversesEncodeEntry(t *testing.T) {
	fields := []any{"uuid", "u-1", "payload", []byte("4:ab:\n"), "", "", "n", int64(-12), "t", true}
	want := []string{"uuid", "u-1", "payload", "4:ab:\n", "", "", "n", "-12", "t", "1"}
	m, err := EncodeEntry(fields)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEntry(m)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("DecodeEntry(%q) = %q, %v; want %q, nil", m, got, err, want)
	}
	for _, bad := range []string{"4:uuid", "x:ab", "4uuid", "9:short", "-1:a1:b", "1:a"} {
		if got, err := DecodeEntry(bad); err == nil {
			t.Errorf("DecodeEntry(%q) = %q, nil; want an error", bad, got)
		}
	}
}
