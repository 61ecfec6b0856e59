package valkeystream

import (
	"bytes"
	"maps"
	"strings"
	"testing"
)

// msgpackBytes builds test data from byte values and strings.
func msgpackBytes(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch p := p.(type) {
		case int:
			b = append(b, byte(p))
		case string:
			b = append(b, p...)
		case []byte:
			b = append(b, p...)
		default:
			panic(p)
		}
	}
	return b
}

func TestDecodeMsgpackStrings(t *testing.T) {
	long32 := strings.Repeat("k", 32)       // the shortest str 8
	long256 := strings.Repeat("v", 256)     // the shortest str 16
	long65536 := strings.Repeat("w", 65536) // the shortest str 32
	sixteen := map[string]string{}
	var sixteenData []byte
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p"} {
		sixteen[k] = "1"
		sixteenData = append(sixteenData, 0xa1, k[0], 0xa1, '1')
	}
	tests := []struct {
		name string
		data []byte
		want map[string]string
	}{
		{name: "empty fixmap", data: msgpackBytes(0x80), want: map[string]string{}},
		{name: "nil map", data: msgpackBytes(0xc0), want: map[string]string{}},
		{name: "fixmap of fixstr", data: msgpackBytes(0x82, 0xa1, "a", 0xa1, "b", 0xa2, "cd", 0xa0), want: map[string]string{"a": "b", "cd": ""}},
		{name: "str 8", data: msgpackBytes(0x81, 0xd9, 32, long32, 0xa1, "x"), want: map[string]string{long32: "x"}},
		{name: "str 16", data: msgpackBytes(0x81, 0xa1, "k", 0xda, 0x01, 0x00, long256), want: map[string]string{"k": long256}},
		{name: "str 32", data: msgpackBytes(0x81, 0xa1, "k", 0xdb, 0x00, 0x01, 0x00, 0x00, long65536), want: map[string]string{"k": long65536}},
		{name: "bin 8, 16, 32", data: msgpackBytes(0x83, 0xa1, "a", 0xc4, 1, "x", 0xa1, "b", 0xc5, 0, 1, "y", 0xa1, "c", 0xc6, 0, 0, 0, 1, "z"),
			want: map[string]string{"a": "x", "b": "y", "c": "z"}},
		{name: "nil string", data: msgpackBytes(0x81, 0xa1, "a", 0xc0), want: map[string]string{"a": ""}},
		{name: "map 16", data: msgpackBytes(0xde, 0x00, 0x10, sixteenData), want: sixteen},
		{name: "map 32", data: msgpackBytes(0xdf, 0, 0, 0, 1, 0xa1, "a", 0xa1, "b"), want: map[string]string{"a": "b"}},
		{name: "binary bytes", data: msgpackBytes(0x81, 0xa2, "\xff\x00", 0xa3, "\xed\xa0\x80"), want: map[string]string{"\xff\x00": "\xed\xa0\x80"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeMsgpackStrings(string(tt.data))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !maps.Equal(got, tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDecodeMsgpackStringsRejects(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{name: "no data", data: nil, want: "the data ends at byte 0"},
		{name: "an integer", data: msgpackBytes(0x01), want: "type code 0x01"},
		{name: "an array", data: msgpackBytes(0x91, 0xa1, "a"), want: "type code 0x91"},
		{name: "a string", data: msgpackBytes(0xa1, "a"), want: "type code 0xa1"},
		{name: "an ext before the map", data: msgpackBytes(0xd4, 0x01, 0x00, 0x80), want: "type code 0xd4"},
		{name: "an integer value", data: msgpackBytes(0x81, 0xa1, "a", 0x05), want: "byte 3 is type code 0x05"},
		{name: "a map value", data: msgpackBytes(0x81, 0xa1, "a", 0x80), want: "byte 3 is type code 0x80"},
		{name: "truncated map 16 length", data: msgpackBytes(0xde, 0x00), want: "middle of a length"},
		{name: "truncated str 8 length", data: msgpackBytes(0x81, 0xa0, 0xd9), want: "middle of a length"},
		{name: "missing value", data: msgpackBytes(0x81, 0xa1, "a"), want: "the data ends at byte 3"},
		{name: "string past the end", data: msgpackBytes(0x81, 0xa5, "a", 0xa0), want: "claims 5 bytes but only 2 follow"},
		{name: "str 32 past the end", data: msgpackBytes(0x81, 0xdb, 0xff, 0xff, 0xff, 0xff, 0xa0), want: "claims 4294967295 bytes"},
		{name: "more pairs than bytes", data: msgpackBytes(0xdf, 0xff, 0xff, 0xff, 0xff, 0xa0, 0xa0), want: "claims 4294967295 pairs"},
		{name: "duplicate key", data: msgpackBytes(0x82, 0xa1, "a", 0xa1, "1", 0xa1, "a", 0xa1, "2"), want: `key "a" at byte 5 occurs twice`},
		{name: "bytes after the map", data: msgpackBytes(0x80, 0xc0), want: "1 bytes follow the map"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeMsgpackStrings(string(tt.data))
			if err == nil {
				t.Fatalf("decoded %q, want an error containing %q", got, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestAppendMsgpackStrings(t *testing.T) {
	long32 := strings.Repeat("k", 32)
	long256 := strings.Repeat("v", 256)
	long65536 := strings.Repeat("w", 65536)
	tests := []struct {
		name string
		m    map[string]string
		want []byte
	}{
		{name: "empty", m: map[string]string{}, want: msgpackBytes(0x80)},
		{name: "sorted fixstr", m: map[string]string{"b": "2", "a": ""}, want: msgpackBytes(0x82, 0xa1, "a", 0xa0, 0xa1, "b", 0xa1, "2")},
		{name: "31 bytes is a fixstr", m: map[string]string{strings.Repeat("x", 31): ""}, want: msgpackBytes(0x81, 0xbf, strings.Repeat("x", 31), 0xa0)},
		{name: "str 8", m: map[string]string{long32: ""}, want: msgpackBytes(0x81, 0xd9, 32, long32, 0xa0)},
		{name: "str 16", m: map[string]string{"k": long256}, want: msgpackBytes(0x81, 0xa1, "k", 0xda, 0x01, 0x00, long256)},
		{name: "str 32", m: map[string]string{"k": long65536}, want: msgpackBytes(0x81, 0xa1, "k", 0xdb, 0, 1, 0, 0, long65536)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := appendMsgpackStrings(nil, tt.m)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("got % x, want % x", got, tt.want)
			}
		})
	}

	// Sixteen pairs and more take a map 16 header.
	m := map[string]string{}
	for i := range 16 {
		m[string(rune('a'+i))] = ""
	}
	got, err := appendMsgpackStrings(nil, m)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	if !bytes.HasPrefix(got, []byte{0xde, 0x00, 0x10, 0xa1, 'a'}) || len(got) != 3+16*3 {
		t.Fatalf("16 pairs encode as % x, want a map 16 header and 16 sorted pairs", got)
	}
}

// FuzzMsgpackStrings checks the decoder on any bytes: it never panics, and
// what it reads, encoded again, reads back the same and re-encodes to the
// same bytes.
//
//	go test -run '^$' -fuzz FuzzMsgpackStrings -fuzztime 30s .
func FuzzMsgpackStrings(f *testing.F) {
	f.Add([]byte{0x80})
	f.Add([]byte{0xc0})
	f.Add(msgpackBytes(0x82, 0xa1, "a", 0xa1, "b", 0xa2, "cd", 0xa0))
	f.Add(msgpackBytes(0x81, 0xd9, 3, "abc", 0xc4, 1, "x"))
	f.Add(msgpackBytes(0xde, 0x00, 0x01, 0xda, 0x00, 0x01, "a", 0xc0))
	f.Add(msgpackBytes(0x82, 0xa1, "a", 0xa1, "1", 0xa1, "a", 0xa1, "2"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMsgpackStrings(string(data))
		if err != nil {
			return
		}
		enc, err := appendMsgpackStrings(nil, m)
		if err != nil {
			t.Fatalf("encoding a decoded map: %v", err)
		}
		again, err := decodeMsgpackStrings(string(enc))
		if err != nil {
			t.Fatalf("decoding % x, encoded from %q: %v", enc, m, err)
		}
		if !maps.Equal(m, again) {
			t.Fatalf("round trip changed %q into %q", m, again)
		}
		enc2, err := appendMsgpackStrings(nil, again)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable: % x then % x (%v)", enc, enc2, err)
		}
	})
}
