package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestPartitions(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	parts := map[string]int{"orders": 4}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c, KeyPrefix: "shop:", Partitions: parts}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(valkeystream.MetadataPartitionKey, fmt.Sprint("k", i))
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: c, KeyPrefix: "shop:", ConsumerGroup: "billing", Consumer: "w1",
		Start: valkeystream.StartHead, Partitions: parts, PartitionOwnerTTL: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	// One message taken and not acknowledged: pending, with what the
	// partitions' loops read ahead.
	select {
	case <-msgs:
	case <-ctx.Done():
		t.Fatal("no message")
	}
	for len(sub.Subscriptions()[0].Owned) < 4 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // the poll of a wait for the partitions owned
	}

	r := cli(t, srv.Addr(), "", "partitions", "orders", "billing", "--prefix", "shop:", "--json")
	if r.code != 0 {
		t.Fatalf("partitions: exit %d, stderr %s", r.code, r.stderr)
	}
	info := decode[partitionsInfo](t, r.stdout)
	streams, _ := valkeystream.PartitionStreams("shop:orders", 4)
	if info.Partitions != 4 || len(info.List) != 4 || info.Topic != "orders" || info.Stream != "shop:orders" {
		t.Fatalf("got %+v, want 4 partitions of topic orders (shop:orders)", info)
	}
	if len(info.Members) != 1 || info.Members[0] != "w1" {
		t.Errorf("members %v, want [w1]", info.Members)
	}
	var length, pending int64
	for i, p := range info.List {
		if p.Stream != streams[i] {
			t.Errorf("partition %d: stream %q, want %q", i, p.Stream, streams[i])
		}
		if !strings.HasPrefix(p.Owner, "w1:") || p.OwnerMS <= 0 {
			t.Errorf("partition %d: owner %q (ttl %d ms), want w1:<epoch> with a TTL", i, p.Owner, p.OwnerMS)
		}
		length += p.Length
		if p.Pending != nil {
			pending += *p.Pending
		}
	}
	if length != 12 || pending < 1 || pending > 12 {
		t.Errorf("lengths sum to %d and pending to %d, want 12 and 1..12", length, pending)
	}
	if r := cli(t, srv.Addr(), "", "partitions", "orders", "billing", "--prefix", "shop:"); r.code != 0 || !strings.Contains(r.stdout, "OWNER") {
		t.Errorf("table: exit %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, srv.Addr(), "", "partitions", "plain"); r.code != 1 || !strings.Contains(r.stderr, "not partitioned") {
		t.Errorf("a plain topic: exit %d, stderr %s, want 1 and 'not partitioned'", r.code, r.stderr)
	}
}

// partitions declare writes the count every side then finds; the same count
// again changes nothing, another one is refused, and so is a topic in use
// as a plain one.
func TestPartitionsDeclare(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ctx := context.Background()

	r := cli(t, srv.Addr(), "", "partitions", "declare", "orders", "8", "--prefix", "shop:", "--json")
	if r.code != 0 {
		t.Fatalf("partitions declare: exit %d, stderr %s", r.code, r.stderr)
	}
	if got := decode[declareResult](t, r.stdout); got != (declareResult{Stream: "shop:orders", Topic: "orders", Partitions: 8, Key: "shop:orders:partitions", Result: "declared"}) {
		t.Errorf("declared: %+v", got)
	}
	if out := ok(t, srv.Addr(), "partitions", "declare", "orders", "8", "--prefix", "shop:"); !strings.Contains(out, "already-declared") {
		t.Errorf("declared again:\n%s", out)
	}
	r = cli(t, srv.Addr(), "", "partitions", "declare", "orders", "4", "--prefix", "shop:")
	if r.code != exitFailure || !strings.Contains(r.stderr, "declared with 8 partitions") || !strings.Contains(r.stderr, "not 4") {
		t.Errorf("another count: exit %d, stderr %s", r.code, r.stderr)
	}
	r = cli(t, srv.Addr(), "", "partitions", "declare", "orders", "2000")
	if r.code != exitUsage || !strings.Contains(r.stderr, "from 1 to 1024") {
		t.Errorf("a count out of range: exit %d, stderr %s", r.code, r.stderr)
	}

	// A Publisher without Partitions finds the count: its message goes to
	// its key's partition.
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c, KeyPrefix: "shop:"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(valkeystream.MetadataPartitionKey, "customer:42")
	if err := pub.Publish("orders", m); err != nil {
		t.Fatal(err)
	}
	streams, _ := valkeystream.PartitionStreams("shop:orders", 8)
	if n := c.XLen(ctx, streams[valkeystream.PartitionOf("customer:42", 8)]).Val(); n != 1 {
		t.Errorf("entries in the partition of customer:42: %d, want 1", n)
	}

	// A plain topic in use.
	if err := pub.Publish("payments", message.NewMessage(watermill.NewUUID(), nil)); err != nil {
		t.Fatal(err)
	}
	r = cli(t, srv.Addr(), "", "partitions", "declare", "payments", "4", "--prefix", "shop:")
	if r.code != exitFailure || !strings.Contains(r.stderr, "in use as a plain topic (its stream holds 1 entries and 0 consumer groups)") {
		t.Errorf("a plain topic in use: exit %d, stderr %s", r.code, r.stderr)
	}
	if n := c.Exists(ctx, "shop:payments:partitions").Val(); n != 0 {
		t.Error("a plain topic in use was declared partitioned")
	}
}
