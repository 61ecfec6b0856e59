package loop

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestBackoffGrowsAndIsBounded(t *testing.T) {
	prev := Backoff(1)
	assert.LessOrEqual(t, prev, backoffMin)
	for attempt := 2; attempt < 20; attempt++ {
		d := Backoff(attempt)
		assert.LessOrEqual(t, d, backoffMax)
		assert.Greater(t, d, backoffMin*8/10)
	}
	assert.Greater(t, Backoff(20), backoffMax*7/10)
}

func TestLogLimit(t *testing.T) {
	l := logLimit{every: 10 * time.Second}
	t0 := time.Unix(0, 0)
	for i, tt := range []struct {
		at       time.Duration
		ok       bool
		withheld int
	}{{0, true, 0}, {time.Second, false, 0}, {9 * time.Second, false, 0}, {10 * time.Second, true, 2}, {11 * time.Second, false, 0}} {
		ok, held := l.allow(t0.Add(tt.at))
		if ok != tt.ok || held != tt.withheld {
			t.Errorf("line %d at %s: allow = %v, %d, want %v, %d", i, tt.at, ok, held, tt.ok, tt.withheld)
		}
	}
}
