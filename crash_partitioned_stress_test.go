//go:build stress

package valkeystream_test

import (
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestCrashAuditPartitionedStress is the full-size partitioned crash audit:
// 8 partitions, 3 worker processes, 500 keys of 30 numbered messages
// (15 000) published over 30 s, a handling of 1 ms, 20 kills about one a
// second while the rounds go out (go test -tags stress -run
// TestCrashAuditPartitionedStress -timeout 30m .).
func TestCrashAuditPartitionedStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	p := crashPartitionedCI
	p.Keys = 500
	p.PerKey = 30
	p.Kills = 20
	p.KillEvery = [2]time.Duration{800 * time.Millisecond, 1400 * time.Millisecond}
	p.PublishFor = 30 * time.Second
	runCrashPartitioned(t, p)
}

// TestCrashAuditPartitionedFreezesStress is the full-size freeze audit: 24
// freezes past PartitionOwnerTTL and 4 kills while 10 000 keyed messages
// are published over 60 s (go test -tags stress -run
// TestCrashAuditPartitionedFreezesStress -timeout 30m .).
func TestCrashAuditPartitionedFreezesStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	if !crashCanFreeze {
		t.Skip("no SIGSTOP on this system")
	}
	p := crashPartitionedFreezesCI
	p.Keys = 200
	p.PerKey = 50
	p.Kills = 4
	p.Freezes = 24
	p.PublishFor = 60 * time.Second
	runCrashPartitioned(t, p)
}
