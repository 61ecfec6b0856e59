package testserver

import "testing"

func TestParseServerInfo(t *testing.T) {
	for _, tc := range []struct {
		info, name, version string
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n", "redis", "7.0.15"},
		{"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n", "valkey", "8.1.1"},
	} {
		name, version := parseServerInfo(tc.info)
		if name != tc.name || version != tc.version {
			t.Errorf("parseServerInfo(%q) = %q, %q; want %q, %q", tc.info, name, version, tc.name, tc.version)
		}
	}
}
