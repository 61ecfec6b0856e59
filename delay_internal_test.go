package valkeystream

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
)

func TestDelayOf(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC) // 05.6 s
	meta := func(forText, untilText string) *message.Message {
		m := message.NewMessage("u", nil)
		if forText != "" {
			m.Metadata.Set(delay.DelayedForKey, forText)
		}
		if untilText != "" {
			m.Metadata.Set(delay.DelayedUntilKey, untilText)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		msg  *message.Message
		want time.Duration
	}{
		{"no metadata", meta("", ""), 0},
		{"for only", meta("1.5s", ""), 1500 * time.Millisecond},
		// delay.For(1.5s) made at now: until 07.1 truncated to 07.
		{"fresh delay.For", meta("1.5s", "2026-01-02T03:04:07Z"), 1500 * time.Millisecond},
		// The same metadata republished at 07.3, after delivery: it waits
		// until the end of second 07 only.
		{"republished within its second", meta("1.5s", "2026-01-02T03:04:07Z"), 700 * time.Millisecond},
		{"republished later", meta("1.5s", "2026-01-02T03:04:04Z"), 0},
		{"until only is exact", meta("", "2026-01-02T03:04:07Z"), 1400 * time.Millisecond},
		{"until with fractions is exact", meta("10s", "2026-01-02T03:04:06.5Z"), 900 * time.Millisecond},
		{"past", meta("-3s", "2026-01-02T03:04:02Z"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := now
			if tc.name == "republished within its second" {
				at = now.Add(1700 * time.Millisecond)
			}
			got, err := delayOf(tc.msg, at)
			if err != nil || got != tc.want {
				t.Fatalf("delayOf = %s, %v; want %s, nil", got, err, tc.want)
			}
		})
	}
	for _, bad := range []*message.Message{meta("soon", ""), meta("", "tomorrow")} {
		if _, err := delayOf(bad, now); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("delayOf(%v) error %v, want ErrInvalidMessage", bad.Metadata, err)
		}
	}
}

// crc16 is the CRC16 (XMODEM) that Redis Cluster hashes keys with.
func crc16(b string) uint16 {
	var crc uint16
	for i := 0; i < len(b); i++ {
		crc ^= uint16(b[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is the cluster hash slot of key, by the hash tag rule.
func keySlot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return crc16(key) % 16384
			}
		}
		break
	}
	return crc16(key) % 16384
}

func TestDelayedKeySharesTheStreamsSlot(t *testing.T) {
	if got := keySlot("123456789"); got != 0x31C3%16384 {
		t.Fatalf("crc16 check value: slot %d, want %d", got, 0x31C3%16384)
	}
	for _, tc := range []struct{ stream, want string }{
		{"orders", "{orders}:delayed"},
		{"app:orders", "{app:orders}:delayed"},
		{"{orders}.eu", "{orders}.eu.delayed"},
		{"app:{orders}", "app:{orders}.delayed"},
		{"{orders}", "{orders}.delayed"},
		{"a{b", "{a{b}:delayed"},
	} {
		got, err := DelayedKey(tc.stream)
		if err != nil || got != tc.want {
			t.Errorf("DelayedKey(%q) = %q, %v; want %q", tc.stream, got, err, tc.want)
			continue
		}
		if keySlot(got) != keySlot(tc.stream) {
			t.Errorf("DelayedKey(%q) = %q is in slot %d, the stream in %d", tc.stream, got, keySlot(got), keySlot(tc.stream))
		}
	}
	for _, stream := range []string{"a}b", "a{}b"} {
		if _, err := DelayedKey(stream); err == nil {
			t.Errorf("DelayedKey(%q): no error; want one (no key can share its slot)", stream)
		}
	}
}

// A field the entry encoding has no form for fails the Publish call as an
// invalid message; the encoding itself is tested in internal/delay.
func TestEncodeDelayedEntry(t *testing.T) {
	if _, err := encodeDelayedEntry([]any{"k", struct{}{}}); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("unsupported type: error %v, want ErrInvalidMessage", err)
	}
}
