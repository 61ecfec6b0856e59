package e2e

import "testing"

func TestStoppedLast(t *testing.T) {
	for _, tc := range []struct {
		output string
		want   bool
	}{
		{"ledger: 00:38:13 stopping\nledger: 00:38:13 stopped\n", true},
		{"ledger: stopped\nredis: 2026/12/08 00:38:13 pool.go:1458: Unexpected conn[10] state changed by hook to CLOSED, closing it\n", true},
		{"ledger: stopping\n", false},
		{"ledger: stopped\npanic: late\n", false},
		{"redis: pool.go: closing\n", false},
		{"", false},
	} {
		if got := stoppedLast(tc.output); got != tc.want {
			t.Errorf("stoppedLast(%q) = %v, want %v", tc.output, got, tc.want)
		}
	}
}
