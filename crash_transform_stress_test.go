//go:build stress

package valkeystream_test

import (
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestCrashAuditTransformStress is the full-size transform audit: at least
// 20 kills (about one a second, more if the workers fall behind: the kills
// go on until the backlog is nearly handled) and 6 freezes over 30 000
// inputs published over 40 s, with ExactlyOnce (no input lost, none without
// an output, none with more than one) and without it, where the control
// must show inputs with more than one output (go test -tags stress -run
// TestCrashAuditTransformStress -timeout 30m .).
func TestCrashAuditTransformStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	params := func(exactlyOnce bool) crashAuditParams {
		p := crashTransformParams(exactlyOnce)
		p.Messages = 30000
		p.Rounds = 20
		p.KillEvery = [2]time.Duration{600 * time.Millisecond, 1500 * time.Millisecond}
		p.PublishFor = 40 * time.Second
		p.Freezes = 6
		return p
	}
	t.Run("ExactlyOnce", func(t *testing.T) {
		runCrashTransform(t, params(true))
	})
	t.Run("Control", func(t *testing.T) {
		r := runCrashTransform(t, params(false))
		if r.multiOutput == 0 {
			t.Errorf("the control, without ExactlyOnce, has no input with more than one output in %d inputs: its kills did not land between an output and its Ack, so the audit did not show what ExactlyOnce prevents", r.inputs)
		}
	})
}
