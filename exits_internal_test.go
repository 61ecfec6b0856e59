package valkeystream

import (
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/loop"
)

// A Close's releases wait until every subscription counted has left, and
// no longer than loop.ExitTimeout for one that does not.
func TestExitsWaitForEverySubscriptionToLeave(t *testing.T) {
	var x exits
	x.wait() // none counted: at once

	a, b := x.add(), x.add()
	a()
	a() // a second call changes nothing
	waited := make(chan struct{})
	go func() {
		x.wait()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("wait returned while a subscription had still to leave")
	case <-time.After(50 * time.Millisecond):
	}
	b()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return once every subscription had left")
	}

	c := x.add() // counted again after the count fell to 0
	start := time.Now()
	x.wait()
	if d := time.Since(start); d < loop.ExitTimeout {
		t.Fatalf("wait returned after %s with a subscription still to leave, want its bound %s", d, loop.ExitTimeout)
	}
	c()
	x.wait()
}
