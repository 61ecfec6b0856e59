package valkeystream

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestConsumerNameSlotsAreReused(t *testing.T) {
	a, releaseA := acquireConsumerName("k", "g", "host")
	b, releaseB := acquireConsumerName("k", "g", "host")
	other, releaseOther := acquireConsumerName("k2", "g", "host")
	assert.Equal(t, "host", a)
	assert.Equal(t, "host-2", b)
	assert.Equal(t, "host", other, "another stream has its own names")
	releaseA()
	c, releaseC := acquireConsumerName("k", "g", "host")
	assert.Equal(t, "host", c, "a released name is taken again, so a restart finds its pending list")
	releaseB()
	releaseC()
	releaseOther()
}
