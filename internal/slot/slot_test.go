package slot

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestCRC16IsXMODEM(t *testing.T) {
	// The check value of CRC-16/XMODEM.
	if got := crc16(0, "123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
}

func TestTag(t *testing.T) {
	tests := []struct{ key, want string }{
		{"orders", "orders"},
		{"{orders}.in", "orders"},
		{"a{orders}b{x}", "orders"},
		{"{}orders", "{}orders"},
		{"{orders", "{orders"},
		{"orders}{", "orders}{"},
		{"x{}{y}", "x{}{y}"},
	}
	for _, tt := range tests {
		if got := Tag(tt.key); got != tt.want {
			t.Errorf("Tag(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

// TestOfAgreesWithTheCluster asks a real cluster node for the slot of keys
// with and without hash tags.
func TestOfAgreesWithTheCluster(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	node := redis.NewClient(&redis.Options{Addr: c.Addrs()[0]})
	defer node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []string{"foo", "orders", "{orders}.out", "valkeystream:dedup:x:1", "{}a", "a{b", "x{}{y}"}
	for i := range 50 {
		keys = append(keys, fmt.Sprintf("topic-%d", i))
	}
	for _, key := range keys {
		want, err := node.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Of(key); int64(got) != want {
			t.Errorf("Of(%q) = %d, the cluster says %d", key, got, want)
		}
	}
}

func TestPrefixContinuesTheHash(t *testing.T) {
	for _, s := range []string{"", "orders#3.", "日本:"} {
		for _, rest := range []string{"", "0", "17", "2048", "x:y"} {
			if got, want := PrefixOf(s).Slot([]byte(rest)), Of(s+rest); got != want {
				t.Errorf("PrefixOf(%q).Slot(%q) = %d, want Of(%q) = %d", s, rest, got, s+rest, want)
			}
		}
	}
}
