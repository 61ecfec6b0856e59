package metrics_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

// A Deduplicator's counters, after one handling of each kind: handled and
// marked, a duplicate skipped, a failure released, a delivery busy on
// another handling's mark, a handling whose mark vanished meanwhile, and
// one whose done mark could not be written.
func TestDeduplicatorCounters(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	ctx := context.Background()
	dedup, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: client, BusyWait: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, reg := register(t, metrics.Config{})
	if err := c.AddDeduplicator("billing", dedup); err != nil {
		t.Fatal(err)
	}
	if err := c.AddDeduplicator("billing", dedup); err == nil {
		t.Error("second AddDeduplicator with one name: no error")
	}
	key := func(uuid string) string { return valkeystream.DefaultDedupKeyPrefix + "orders:billing:" + uuid }
	delivered := func(uuid string) *message.Message {
		m := message.NewMessage(uuid, []byte("p"))
		m.Metadata.Set(valkeystream.MetadataStream, "orders")
		m.Metadata.Set(valkeystream.MetadataGroup, "billing")
		return m
	}
	run := func(uuid string, h message.HandlerFunc) error {
		_, err := dedup.Middleware(h)(delivered(uuid))
		return err
	}
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }

	done := watermill.NewUUID()
	if err := run(done, ok); err != nil {
		t.Fatal(err)
	}
	if err := run(done, ok); err != nil { // the duplicate
		t.Fatal(err)
	}
	if err := run(watermill.NewUUID(), func(*message.Message) ([]*message.Message, error) { return nil, errors.New("fails") }); err == nil {
		t.Fatal("a failing handler succeeded")
	}
	busy := watermill.NewUUID()
	client.Set(ctx, key(busy), "running:elsewhere", 0)
	if err := run(busy, ok); !errors.Is(err, valkeystream.ErrDuplicateInProgress) {
		t.Fatalf("busy delivery: %v, want ErrDuplicateInProgress", err)
	}
	// The handler removes its own in-progress mark: it is lost.
	lost := watermill.NewUUID()
	if err := run(lost, func(*message.Message) ([]*message.Message, error) {
		return nil, client.Del(ctx, key(lost)).Err()
	}); err != nil {
		t.Fatal(err)
	}
	// The handler puts a key of another type in its mark's place: the done
	// mark cannot be written (WRONGTYPE), the message is Acked all the same.
	unmarked := watermill.NewUUID()
	if err := run(unmarked, func(*message.Message) ([]*message.Message, error) {
		client.Del(ctx, key(unmarked))
		return nil, client.HSet(ctx, key(unmarked), "f", "v").Err()
	}); err != nil {
		t.Fatal(err)
	}

	want := valkeystream.DedupStats{Handled: 4, Marked: 2, Skipped: 1, Busy: 1, Released: 1, LostMarks: 1, MarkFailures: 1, Faults: 1}
	if got := dedup.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	g := gather(t, reg)
	for name, v := range map[string]int64{
		"valkeystream_dedup_handled_total":       want.Handled,
		"valkeystream_dedup_marked_total":        want.Marked,
		"valkeystream_dedup_skipped_total":       want.Skipped,
		"valkeystream_dedup_busy_total":          want.Busy,
		"valkeystream_dedup_released_total":      want.Released,
		"valkeystream_dedup_lost_marks_total":    want.LostMarks,
		"valkeystream_dedup_mark_failures_total": want.MarkFailures,
		"valkeystream_dedup_faults_total":        want.Faults,
		"valkeystream_dedup_given_up_total":      want.GivenUp,
	} {
		g.want(t, name, "deduplicator=billing", float64(v))
	}
}
