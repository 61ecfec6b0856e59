package valkeystream_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// oldestWatermill is the oldest Watermill the module supports, the one its
// go.mod requires (README, "Watermill versions").
const oldestWatermill = "v1.4.7"

// requiredWatermill is the Watermill version a go.mod requires.
func requiredWatermill(t *testing.T, goMod string) string {
	t.Helper()
	b, err := os.ReadFile(goMod)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*github\.com/ThreeDotsLabs/watermill (v\S+)`).FindSubmatch(b)
	require.NotNil(t, m, "%s requires no Watermill", goMod)
	return string(m[1])
}

// TestTestsRunOnTheOldestWatermill fails when the module's requirement
// moves past the oldest Watermill it supports (a `go get -u` does that):
// the library and these tests would then no longer prove that a service on
// Watermill 1.4 can use it. The compat and examples modules require a newer
// one, so that both ends of the range run in every pass.
func TestTestsRunOnTheOldestWatermill(t *testing.T) {
	assert.Equal(t, oldestWatermill, requiredWatermill(t, "go.mod"),
		"go.mod must require the oldest Watermill supported; raise oldestWatermill and the README only when dropping a version")
	for _, mod := range []string{"compat/go.mod", "examples/go.mod"} {
		assert.NotEqual(t, oldestWatermill, requiredWatermill(t, mod),
			"%s must require a newer Watermill than the root module", mod)
	}
}
