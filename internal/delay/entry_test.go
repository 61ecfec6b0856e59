package delay

import "testing"

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
