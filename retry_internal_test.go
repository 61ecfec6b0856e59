package valkeystream

import (
	"testing"
	"time"

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

func TestNackDelay(t *testing.T) {
	defaults := SubscriberConfig{NackBackoffMax: DefaultNackBackoffMax}
	tests := []struct {
		name  string
		cfg   SubscriberConfig
		count int64
		want  time.Duration
	}{
		{"first delivery: at once", defaults, 1, 0},
		{"second delivery", defaults, 2, 25 * time.Millisecond},
		{"third delivery", defaults, 3, 50 * time.Millisecond},
		{"fourth delivery", defaults, 4, 100 * time.Millisecond},
		{"capped", defaults, 9, DefaultNackBackoffMax},
		{"a huge count stays capped", defaults, 1 << 40, DefaultNackBackoffMax},
		{"own cap", SubscriberConfig{NackBackoffMax: 10 * time.Second}, 7, 800 * time.Millisecond},
		{"own cap reached", SubscriberConfig{NackBackoffMax: 10 * time.Second}, 20, 10 * time.Second},
		{"fixed delay", SubscriberConfig{NackResendDelay: time.Second, NackBackoffMax: DefaultNackBackoffMax}, 7, time.Second},
		{"at once", SubscriberConfig{NackResendDelay: NackAtOnce, NackBackoffMax: DefaultNackBackoffMax}, 7, 0},
	}
	for _, tt := range tests {
		if got := nackDelay(&tt.cfg, tt.count); got != tt.want {
			t.Errorf("%s: nackDelay(count %d) = %s, want %s", tt.name, tt.count, got, tt.want)
		}
	}
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
