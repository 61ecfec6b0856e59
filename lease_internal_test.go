package valkeystream

import (
	"errors"
	"testing"
	"time"
)

func TestLeasePeriodIsAThirdOfClaimMinIdle(t *testing.T) {
	if got := newLease(3 * time.Second).every; got != time.Second {
		t.Fatalf("period is %s, want 1s", got)
	}
}

func TestLeaseIsDueOnlyWhileHolding(t *testing.T) {
	ls := newLease(30 * time.Millisecond)
	ls.start()
	if ls.due(false) != nil {
		t.Fatal("due while holding nothing, want nil")
	}
	if !fired(ls.due(true), 10*time.Second) {
		t.Fatal("the renewal never came due")
	}
}

func TestLeaseLogsTheFirstFailureOfAStreak(t *testing.T) {
	ls := newLease(time.Hour)
	fault := errors.New("timeout")
	for i, tt := range []struct {
		err  error
		want bool
	}{{fault, true}, {fault, false}, {nil, false}, {fault, true}} {
		if got := ls.renewed(tt.err); got != tt.want {
			t.Fatalf("renewal %d (err %v): firstFailure %v, want %v", i, tt.err, got, tt.want)
		}
	}
	ls.stop()
}
