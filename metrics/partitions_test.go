package metrics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

// A subscription of a partitioned topic: the partitions it owns, its
// counters, and each partition stream's group sampled on the server (the
// topic's own key holds no stream).
func TestPartitionMetrics(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	parts := map[string]int{"orders": 4}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: parts}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartHead,
		Partitions: parts, PartitionOwnerTTL: time.Second,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c, reg := register(t, metrics.Config{Client: client})
	if err := c.AddSubscriber("orders", sub); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(valkeystream.MetadataPartitionKey, fmt.Sprint("k", i))
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
	for range 8 {
		select {
		case m := <-msgs:
			m.Ack()
		case <-ctx.Done():
			t.Fatal("not every message came")
		}
	}
	streams, err := valkeystream.PartitionStreams("orders", 4)
	if err != nil {
		t.Fatal(err)
	}
	g := gather(t, reg)
	g.want(t, "valkeystream_partitions_owned", "subscriber=orders", 4)
	g.want(t, "valkeystream_partition_acquired_total", "subscriber=orders", 4)
	g.want(t, "valkeystream_partition_fenced_total", "subscriber=orders", 0)
	g.want(t, "valkeystream_partition_late_hand_overs_total", "subscriber=orders", 0)
	for _, s := range streams {
		g.want(t, "valkeystream_partition_owned", "consumer=c,group=g,stream="+s+",subscriber=orders", 1)
		if _, ok := g["valkeystream_group_pending"]["group=g,stream="+s]; !ok {
			t.Errorf("valkeystream_group_pending{stream=%s} missing: the partition's group is not sampled; have %v", s, g["valkeystream_group_pending"])
		}
	}
	if v, ok := g["valkeystream_group_pending"]["group=g,stream=orders"]; ok {
		t.Errorf("the topic's own key was sampled as a stream: %v", v)
	}
}
