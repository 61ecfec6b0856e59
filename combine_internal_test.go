package valkeystream

import (
	"errors"
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/combine"
)

// A WAIT that fell short becomes an error wrapping ErrNotReplicated, with
// the combiner's report after it; other errors pass unchanged.
func TestCombinerWaitErrorsWrapErrNotReplicated(t *testing.T) {
	wait := combine.ReplicaWait{Replicas: 1, Timeout: 50 * time.Millisecond}
	lost := errors.New("connection reset")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"too few", &combine.NotReplicatedError{Wait: wait}, "valkeystream: not acknowledged by enough replicas: 0 of 1 replicas acknowledged within 50ms"},
		{"reply lost", &combine.NotReplicatedError{Wait: wait, Err: lost}, "valkeystream: not acknowledged by enough replicas: WAIT 1 50 failed: connection reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := notReplicated(tc.err)
			if got := err.Error(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if !errors.Is(err, ErrNotReplicated) {
				t.Errorf("%v does not wrap ErrNotReplicated", err)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("%v does not wrap the combiner's report", err)
			}
		})
	}
	for _, err := range []error{nil, lost, combine.ErrSendAborted} {
		if got := notReplicated(err); got != err {
			t.Errorf("notReplicated(%v) = %v, want it unchanged", err, got)
		}
	}
}
