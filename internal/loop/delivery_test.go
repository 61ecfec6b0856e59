package loop

import (
	"slices"
	"strings"
	"testing"
)

func TestASettledDeliverysAckSendsNoXACK(t *testing.T) {
	srv := newFakeServer(3)
	cfg := testConfig()
	cfg.AckFlushInterval = -1 // every Ack at once
	deps := testDeps(srv)
	out, cancel, done := runWith(t, cfg, deps)
	for _, id := range []string{"1-0", "2-0", "3-0"} {
		msg := receive(t, out)
		d := DeliveryOf(msg.Context())
		if d == nil {
			t.Fatalf("message %s: no delivery in its context", msg.UUID)
		}
		want := Delivery{Stream: "s", Group: "g", Consumer: "c", ID: id, Count: 1}
		if d.Stream != want.Stream || d.Group != want.Group || d.Consumer != want.Consumer || d.ID != want.ID || d.Count != want.Count {
			t.Fatalf("delivery of %s: got %+v, want %+v", id, d, &want)
		}
		if id == "2-0" {
			d.Settle()
		}
		msg.Ack()
	}
	cancel()
	<-done
	var acked []string
	for _, line := range srv.calls() {
		if rest, ok := strings.CutPrefix(line, "ack "); ok {
			acked = append(acked, strings.Split(rest, ",")...)
		}
	}
	slices.Sort(acked)
	if want := []string{"1-0", "3-0"}; !slices.Equal(acked, want) {
		t.Fatalf("acknowledged %v, want %v (the settled 2-0 must send no XACK); log:\n%s", acked, want, strings.Join(srv.calls(), "\n"))
	}
	if got := deps.Counters.Settled.Load(); got != 1 {
		t.Fatalf("Settled = %d, want 1", got)
	}
}

func TestAnOrderedLoopRedeliversARetryAfterBeforeTheNext(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		srv := newFakeServer(2)
		cfg := testConfig()
		cfg.Ordered = ordered
		out, _, _ := run(t, cfg, srv, nil)
		first := receive(t, out)
		first.Metadata.Set(MetadataRetryAfter, "1h")
		first.Nack()
		next := receive(t, out)
		want := "2-0" // deferred for an hour: the next one flows on
		if ordered {
			want = "1-0" // a plain Nack: it comes back first
		}
		if next.UUID != want {
			t.Fatalf("ordered=%v: after a RetryAfter of 1-0 came %s, want %s", ordered, next.UUID, want)
		}
		next.Ack()
	}
}
