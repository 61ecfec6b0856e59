package partition

import "testing"

// The values were computed apart from this code, with the Python lines in
// the doc of Of, so that a producer in another language is held to the same
// numbers.
func TestOfPinsFNV1aModuloN(t *testing.T) {
	tests := []struct {
		key       string
		hash      uint32
		of8, of12 int
	}{
		{"", 0x811c9dc5, 5, 1},
		{"a", 0xe40c292c, 4, 4},
		{"order-1", 0x2b7fcd6d, 5, 1},
		{"order-2", 0x287fc8b4, 4, 4},
		{"customer:42", 0x3d2af77f, 7, 3},
		{"user/7", 0x634e1670, 0, 8},
		{"héllo", 0x4aa48540, 0, 0},
		{"日本", 0x9f26ee51, 1, 9},
	}
	for _, tt := range tests {
		if got := Of(tt.key, 8); got != tt.of8 {
			t.Errorf("Of(%q, 8) = %d, want %d", tt.key, got, tt.of8)
		}
		if got := Of(tt.key, 12); got != tt.of12 {
			t.Errorf("Of(%q, 12) = %d, want %d", tt.key, got, tt.of12)
		}
		// n = 2^32 would be the hash itself; n = 1<<31 keeps all but the top bit.
		if got := Of(tt.key, 1<<31); got != int(tt.hash%(1<<31)) {
			t.Errorf("Of(%q, 1<<31) = %d, want the hash %#x without its top bit", tt.key, got, tt.hash)
		}
	}
}
