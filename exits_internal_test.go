package valkeystream

import (
	"context"
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/loop"
)

// Subscriptions that end together release their names once every one of
// them has done its last round trip, and wait no longer than
// loop.ExitTimeout for one that does not; one that ends alone waits for
// nobody.
func TestExitsOrderTheReleasesOfSubscriptionsThatEndTogether(t *testing.T) {
	var x exits
	ctx, cancel := context.WithCancel(context.Background())
	released := make(chan string, 3)
	releaseOf := func(name string) func() { return func() { released <- name } }
	a, b := x.around(ctx, releaseOf("a")), x.around(ctx, releaseOf("b"))
	cancel() // both end
	// waitCounted waits until n subscriptions count as leaving.
	waitCounted := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			x.mu.Lock()
			leaving := x.leaving
			x.mu.Unlock()
			if leaving == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d counted, want %d", what, leaving, n)
			}
		}
	}
	waitCounted("both counted once their context ended", 2)
	go a() // a's last round trip is done: it waits for b's
	select {
	case name := <-released:
		t.Fatalf("%s released its name while b had its last round trip to do", name)
	case <-time.After(50 * time.Millisecond):
	}
	b()
	for _, want := range []string{"a", "b"} {
		select {
		case <-released:
		case <-time.After(5 * time.Second):
			t.Fatalf("no release of %s once both were done", want)
		}
	}

	// One that ends alone releases at once.
	alone, end := context.WithCancel(context.Background())
	c := x.around(alone, releaseOf("c"))
	end()
	waitCounted("c counted", 1)
	c()
	if got := <-released; got != "c" {
		t.Fatalf("released %s, want c", got)
	}

	// One whose context has not ended is not counted, and waits at most
	// the bound for one that never finishes.
	stuck, endStuck := context.WithCancel(context.Background())
	defer endStuck()
	_ = x.around(stuck, func() {})
	live := x.around(context.Background(), releaseOf("live"))
	endStuck()
	waitCounted("the stuck one counted", 1)
	start := time.Now()
	live() // not counted itself: it does not wait
	<-released
	if d := time.Since(start); d >= loop.ExitTimeout {
		t.Fatalf("a release whose context had not ended waited %s", d)
	}
	ended, endIt := context.WithCancel(context.Background())
	late := x.around(ended, releaseOf("late"))
	endIt()
	waitCounted("late counted", 2)
	start = time.Now()
	late()
	<-released
	if d := time.Since(start); d < loop.ExitTimeout {
		t.Fatalf("released after %s while another ended one had its last round trip to do, want the bound %s", d, loop.ExitTimeout)
	}
}
