package bounded

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCallReturnsWhenTheCallDoes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := false
	if err := Call(ctx, func() { ran = true }); err != nil || !ran {
		t.Fatalf("Call = %v, ran %v; want nil, true", err, ran)
	}
	if err := Call(context.Background(), func() { ran = false }); err != nil || ran {
		t.Fatalf("Call without an end = %v, ran %v; want nil and the call run", err, !ran)
	}
}

func TestCallReturnsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	release := make(chan struct{})
	defer close(release)
	if err := Call(ctx, func() { <-release }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Call of a call that hangs = %v, want the context's deadline", err)
	}
	ended, stop := context.WithCancel(context.Background())
	stop()
	if err := Call(ended, func() { t.Error("a call ran after its context ended") }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Call with an ended context = %v, want context.Canceled", err)
	}
}

// A cancelled context still waits Grace for a call in progress: one that
// ends within it keeps its result.
func TestCallWaitsGraceAfterACancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := false
	started := make(chan struct{})
	go func() {
		<-started // the cancel comes while the call is in progress
		cancel()
	}()
	call := func() {
		close(started)
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // the time is the scenario: the call ends within Grace after the cancel
		ran = true
	}
	if err := Call(ctx, call); err != nil || !ran {
		t.Fatalf("Call = %v, ran %v: a call that ends within Grace after the cancel must be waited for", err, ran)
	}
	hang := make(chan struct{})
	defer close(hang)
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := Call(ctx2, func() { <-hang }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Call of a call that hangs = %v, want context.Canceled", err)
	}
}
