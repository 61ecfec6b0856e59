package valkeystream

import (
	"hash/fnv"
	"testing"
	"time"
)

// The producer id of a UUID is part of what the server stores: a change
// would make Publishers of different versions miss each other's copies.
func TestIdempotentProducerIsPinned(t *testing.T) {
	for _, tc := range []struct{ uuid, want string }{
		{"a", "valkeystream-c"},
		{"order-1", "valkeystream-d"},
		{"0b5e3c1e-8f4e-4c9a-9d2f-1a2b3c4d5e6f", "valkeystream-8"},
	} {
		if got := idempotentProducer(tc.uuid); got != tc.want {
			t.Errorf("idempotentProducer(%q) = %q, want %q", tc.uuid, got, tc.want)
		}
	}
	for _, uuid := range []string{"", "a", "0b5e3c1e-8f4e-4c9a-9d2f-1a2b3c4d5e6f", "ünïcode"} {
		h := fnv.New32a()
		_, _ = h.Write([]byte(uuid))
		if got, want := idempotentProducer(uuid), producerIDs[h.Sum32()%idempotentProducers]; got != want {
			t.Errorf("idempotentProducer(%q) = %q, want %q (hash/fnv's FNV-1a)", uuid, got, want)
		}
	}
	seen := map[string]bool{}
	for i := range 1000 {
		seen[idempotentProducer(time.Duration(i).String())] = true
	}
	if len(seen) != idempotentProducers {
		t.Errorf("1000 UUIDs used %d producer ids, want %d", len(seen), idempotentProducers)
	}
}

func TestIdempotencyMarkKey(t *testing.T) {
	for _, tc := range []struct {
		name, stream, want string
		err                bool
	}{
		{"plain", "shop:orders", "{shop:orders}:idmp:u1", false},
		{"hash tag", "{shop}:orders", "{shop}:orders.idmp:u1", false},
		{"tag of the whole key", "{orders}", "{orders}.idmp:u1", false},
		{"empty braces are no tag", "orders{}", "", true},
		{"closing brace without a tag", "ord}ers", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idempotencyMarkKey(tc.stream, "u1")
			if tc.err {
				if err == nil {
					t.Fatalf("idempotencyMarkKey(%q) = %q, want an error", tc.stream, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("idempotencyMarkKey(%q) = %q, %v; want %q", tc.stream, got, err, tc.want)
			}
		})
	}
}

func TestIdempotentWindowSeconds(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		want   int64
	}{{time.Second, 1}, {1500 * time.Millisecond, 2}, {100 * time.Second, 100}, {MaxIdempotentWindow, 86400}} {
		if got := idempotentWindowSeconds(tc.window); got != tc.want {
			t.Errorf("idempotentWindowSeconds(%s) = %d, want %d", tc.window, got, tc.want)
		}
	}
}
