package valkeystream

import "time"

// nackDelay returns how long an entry Nacked on delivery number count waits
// before it is delivered again (see SubscriberConfig.NackResendDelay).
func nackDelay(cfg *SubscriberConfig, count int64) time.Duration {
	switch {
	case cfg.NackResendDelay > 0:
		return cfg.NackResendDelay
	case cfg.NackResendDelay < 0, count <= 1:
		// A first failure is often passing: it is retried at once, and
		// only a message that keeps failing backs off.
		return 0
	}
	d := DefaultNackBackoffMin
	for i := int64(2); i < count && d < cfg.NackBackoffMax; i++ {
		d *= 2
	}
	return min(d, cfg.NackBackoffMax)
}
