//go:build stress

package partition

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/echomq/valkeystream/internal/testserver"
)

// When one of two drivers closes, the other owns every partition within a
// few beats: far sooner than the TTL its records would have taken to lapse.
// (TestDriverTakesOverWhenAMemberCloses checks that the Close leaves
// nothing to lapse; this bounds the wall clock, for a quiet machine.)
func TestDriverTakesOverSoonAfterAMemberCloses(t *testing.T) {
	testserver.Parallel(t)
	e := newDriverEnv(t, 8)
	stop := e.publish(t, 100*time.Millisecond)
	e.start(t, "a")
	b := e.start(t, "b")
	e.waitOwners(t, map[string]int{"a": 4, "b": 4})
	b.close()
	took := e.waitOwners(t, map[string]int{"a": 8})
	t.Logf("closed -> all taken over: %s (beat %s, owner TTL %s)", took, testBeat, testTTL)
	assert.Less(t, took, testTTL-time.Second, "a took the partitions over after a wait for their TTL")
	stop()
	e.waitDelivered(t)
	e.assertOnceInOrder(t)
}
