package valkeystream

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBackoffGrowsAndIsBounded(t *testing.T) {
	prev := backoff(1)
	assert.LessOrEqual(t, prev, backoffMin)
	for attempt := 2; attempt < 20; attempt++ {
		d := backoff(attempt)
		assert.LessOrEqual(t, d, backoffMax)
		assert.Greater(t, d, backoffMin*8/10)
	}
	assert.Greater(t, backoff(20), backoffMax*7/10)
}
