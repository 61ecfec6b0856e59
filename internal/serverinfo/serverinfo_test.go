package serverinfo

import "testing"

func TestMajor(t *testing.T) {
	tests := []struct {
		info string
		want int
	}{
		{"# Server\r\nredis_version:6.2.16\r\nredis_mode:standalone\r\n", 6},
		{"# Server\r\nredis_version:7.0.15\r\n", 7},
		{"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n", 7},
		{"# Server\r\n", 0},
		{"redis_version:x.y\r\n", 0},
	}
	for _, tt := range tests {
		if got := Major(tt.info); got != tt.want {
			t.Errorf("Major(%q) = %d, want %d", tt.info, got, tt.want)
		}
	}
	if ReportsLag("redis_version:6.2.16\r\n") || !ReportsLag("redis_version:7.0.0\r\n") {
		t.Error("ReportsLag: want false for 6.2 and true for 7.0")
	}
}
