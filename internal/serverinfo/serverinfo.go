// Package serverinfo reads facts about the server from its INFO reply.
package serverinfo

import (
	"strconv"
	"strings"
)

// Major returns the major version in an INFO server reply (redis_version,
// which Valkey reports too: 7.2 for every Valkey), or 0 when it has none.
func Major(info string) int {
	_, rest, found := strings.Cut(info, "redis_version:")
	if !found {
		return 0
	}
	major, _, _ := strings.Cut(rest, ".")
	n, _ := strconv.Atoi(strings.TrimSpace(major))
	return n
}

// ReportsLag reports whether a server whose INFO server reply is info gives
// a group's lag in XINFO GROUPS: Redis 7.0 and later, and every Valkey.
func ReportsLag(info string) bool { return Major(info) >= 7 }
