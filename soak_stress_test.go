//go:build stress

package valkeystream_test

import (
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/testserver"
)

// soakStressFor is how long the faults go on in the stress variants; the
// drain, the replay and the checks add a minute or two.
const soakStressFor = 20 * time.Minute

// TestChaosSoakStress is the chaos soak for 20 minutes of faults on one
// private server (VALKEYSTREAM_SOAK_FOR changes it; go test -tags stress
// -run TestChaosSoakStress -timeout 40m .). It skips when the test binary's
// -timeout would end it first.
func TestChaosSoakStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	p := soakStressParams(t)
	runSoak(t, p, newSoakSingleServer)
}

// TestChaosSoakClusterStress is TestChaosSoakStress on a cluster.
func TestChaosSoakClusterStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	p := soakStressParams(t)
	runSoak(t, p, newSoakCluster)
}

// soakStressParams are the CI soak's, for soakStressFor, with the plain
// topic's rate lowered so that the fan-out of a restarted worker, which
// reads the plain stream from its head, stays a small part of its work.
func soakStressParams(t *testing.T) soakParams {
	p := soakCI
	p.For = soakDuration(t, soakStressFor)
	p.PlainEvery = 200 * time.Millisecond
	if deadline, ok := t.Deadline(); ok && time.Until(deadline) < p.For+10*time.Minute {
		t.Skipf("the soak runs %s of faults, then drains and judges: give the test binary -timeout %s or more (it has %s left)",
			p.For, (p.For + 10*time.Minute).Round(time.Minute), time.Until(deadline).Round(time.Second))
	}
	return p
}
