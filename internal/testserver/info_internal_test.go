package testserver

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

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

// A server waited for by its process answers only as that process: the
// server a parallel test started on the same port does not pass for it.
func TestPingWithAPidTellsAnotherServer(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	c := newClient(s.Addr())
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(infoFields(info)["process_id"])
	if err != nil {
		t.Fatalf("process_id in INFO server: %v", err)
	}
	if err := ping(ctx, s.Addr(), pid); err != nil {
		t.Errorf("ping as its own process: %v", err)
	}
	if err := ping(ctx, s.Addr(), pid+1); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Errorf("ping as another process: %v, want an error naming another server", err)
	}
}
