package valkeystream

import (
	"testing"
	"time"
)

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
