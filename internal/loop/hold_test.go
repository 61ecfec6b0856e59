package loop

import (
	"errors"
	"testing"
	"time"
)

func TestHoldBeatIsAThirdOfClaimMinIdle(t *testing.T) {
	if got := newHoldBeat(3 * time.Second).every; got != time.Second {
		t.Fatalf("period is %s, want 1s", got)
	}
}

func TestHoldBeatIsDueOnlyWhileHolding(t *testing.T) {
	ls := newHoldBeat(30 * time.Millisecond)
	ls.start()
	if ls.due(false) != nil {
		t.Fatal("due while holding nothing, want nil")
	}
	if !fired(ls.due(true), 10*time.Second) {
		t.Fatal("the beat never came due")
	}
}

func TestHoldBeatLogsTheFirstFailureOfAStreak(t *testing.T) {
	ls := newHoldBeat(time.Hour)
	fault := errors.New("timeout")
	for i, tt := range []struct {
		err  error
		want bool
	}{{fault, true}, {fault, false}, {nil, false}, {fault, true}} {
		if got := ls.kept(tt.err); got != tt.want {
			t.Fatalf("beat %d (err %v): firstFailure %v, want %v", i, tt.err, got, tt.want)
		}
	}
	ls.stop()
}
