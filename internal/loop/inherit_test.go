package loop

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// fakeInheritance is an Inheritance a test drives.
type fakeInheritance struct {
	moved    chan struct{}
	watching atomic.Bool
}

func (f *fakeInheritance) Moved() <-chan struct{} { return f.moved }
func (f *fakeInheritance) Watching() bool         { return f.watching.Load() }

// moveIn makes id an entry of the stream that is pending for this
// consumer, delivered once elsewhere: what a move from another name does.
func (f *fakeServer) moveIn(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids = append(f.ids, id)
	f.next = len(f.ids)
	f.pending[id] = 1
}

// Rule: entries moved to the loop's consumer from another name are drained
// once Moved receives, before anything new, with their delivery grown by
// one; the loop reads on as before.
func TestMovedEntriesAreDrainedBeforeNewOnes(t *testing.T) {
	srv := newFakeServer(1)
	inherit := &fakeInheritance{moved: make(chan struct{}, 1)}
	inherit.watching.Store(true)
	deps := testDeps(srv)
	deps.Inherit = inherit
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewGroup(testConfig(), deps, out).Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		for range out {
		}
		<-done
	})

	var got []string
	take := func() {
		m := receive(t, out)
		got = append(got, m.UUID+"#"+m.Metadata.Get(MetadataDeliveryCount))
		m.Ack()
	}
	take()
	srv.moveIn("2-0")
	inherit.moved <- struct{}{}
	take()
	inherit.watching.Store(false)
	srv.add(1)
	take()
	want := []string{"1-0#1", "2-0#2", "3-0#1"}
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v; log:\n%s", got, want, strings.Join(srv.calls(), "\n"))
	}
}
