package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

// addAged writes n messages to stream with entry ids age in the past, as the
// Publisher would encode them.
func addAged(t *testing.T, client *redis.Client, stream string, n int, age time.Duration) {
	t.Helper()
	ms := time.Now().Add(-age).UnixMilli()
	for i := range n {
		fields, err := valkeystream.DefaultMarshaler{}.Marshal(stream, message.NewMessage(watermill.NewUUID(), []byte("p")))
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("%d-%d", ms, i+1)
		if err := client.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, ID: id, Values: fields}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// histogram returns the histogram of name with the given label values, or
// fails.
func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Histogram {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetHistogram()
		}
	}
	t.Fatalf("%s%v missing", name, labels)
	return nil
}

// bucketCount is the cumulative count of the bucket whose upper bound is le.
func bucketCount(t *testing.T, h *dto.Histogram, le float64) uint64 {
	t.Helper()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	t.Fatalf("no bucket le=%v", le)
	return 0
}

// The age of entries at delivery: entries two minutes old, one of them
// Nacked once, through a group; and one entry through fan-out.
func TestDeliveryAge(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	const age = 2 * time.Minute
	addAged(t, client, "orders", 3, age)

	c, reg := register(t, metrics.Config{DeliveryAgeBuckets: []float64{60, 600}})

	group, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "billing", Consumer: "w1", Start: valkeystream.StartHead,
		NackResendDelay: time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	fanOut, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, Start: valkeystream.StartHead}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fanOut.Close()
	if err := c.AddSubscriber("billing", group); err != nil {
		t.Fatal(err)
	}
	if err := c.AddSubscriber("audit", fanOut); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := group.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	nacked := false
	for acked := 0; acked < 3; {
		select {
		case m := <-msgs:
			if !nacked {
				nacked = true
				m.Nack()
				continue
			}
			m.Ack()
			acked++
		case <-ctx.Done():
			t.Fatal("timed out consuming")
		}
	}
	all, err := fanOut.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case m := <-all:
			m.Ack()
		case <-ctx.Done():
			t.Fatal("timed out consuming in fan-out")
		}
	}

	for _, tc := range []struct {
		labels map[string]string
		want   uint64
	}{
		{map[string]string{"subscriber": "billing", "stream": "orders", "group": "billing"}, 4}, // 3 and a redelivery
		{map[string]string{"subscriber": "audit", "stream": "orders", "group": ""}, 3},
	} {
		// A group subscription observes a delivery once its receiver took
		// it, which the receiver can see first: wait for the count.
		h := histogram(t, reg, "valkeystream_delivery_age_seconds", tc.labels)
		for deadline := time.Now().Add(5 * time.Second); h.GetSampleCount() < tc.want && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond) // the poll of a wait for the count
			h = histogram(t, reg, "valkeystream_delivery_age_seconds", tc.labels)
		}
		if got := h.GetSampleCount(); got != tc.want {
			t.Errorf("%v: %d deliveries observed, want %d", tc.labels, got, tc.want)
		}
		// Two minutes old, observed within the minute's timeout.
		if got := bucketCount(t, h, 60); got != 0 {
			t.Errorf("%v: %d deliveries younger than 60 s, want 0", tc.labels, got)
		}
		if got := bucketCount(t, h, 600); got != tc.want {
			t.Errorf("%v: %d deliveries younger than 600 s, want %d", tc.labels, got, tc.want)
		}
		if lo, sum := age.Seconds()*float64(tc.want), h.GetSampleSum(); sum < lo || sum > lo+60*float64(tc.want) {
			t.Errorf("%v: sum of ages %.1f s, want %.0f s to %.0f s", tc.labels, sum, lo, lo+60*float64(tc.want))
		}
	}
}

// With no collector the Subscriber observes nothing; SetDeliveryObserver(nil)
// removes the Collector's observer.
func TestDeliveryAgeRemoved(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	addAged(t, client, "orders", 1, time.Second)
	c, reg := register(t, metrics.Config{})
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, Start: valkeystream.StartHead}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := c.AddSubscriber("s", sub); err != nil {
		t.Fatal(err)
	}
	sub.SetDeliveryObserver(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		m.Ack()
	case <-ctx.Done():
		t.Fatal("timed out consuming")
	}
	if got := gather(t, reg)["valkeystream_delivery_age_seconds"]; len(got) != 0 {
		t.Errorf("delivery ages observed without an observer: %v", got)
	}
}

// The gauges of entries read ahead and in flight, while a handler holds the
// first of five messages read in one batch.
func TestReadAheadAndInFlight(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	addAged(t, client, "orders", 5, time.Second)
	c, reg := register(t, metrics.Config{})
	// Full batches from the first read: all five are fetched at once.
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "billing", Consumer: "w1", Start: valkeystream.StartHead,
		PrefetchWindow: valkeystream.FullBatches, ReadAheadBytes: valkeystream.NoReadAheadLimit,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := c.AddSubscriber("billing", sub); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	var held *message.Message
	select {
	case held = <-msgs:
	case <-ctx.Done():
		t.Fatal("timed out consuming")
	}
	g := gather(t, reg)
	g.want(t, "valkeystream_subscriber_in_flight", "subscriber=billing", 1)
	g.want(t, "valkeystream_subscriber_read_ahead", "subscriber=billing", 4)

	held.Ack()
	for range 4 {
		select {
		case m := <-msgs:
			m.Ack()
		case <-ctx.Done():
			t.Fatal("timed out consuming")
		}
	}
	// The last Ack is seen by the loop after the channel handed the message
	// over: wait for the gauge, not a sleep.
	deadline := time.Now().Add(time.Minute)
	for gather(t, reg)["valkeystream_subscriber_in_flight"]["subscriber=billing"] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("in_flight still not 0 a minute after the last Ack")
		}
		time.Sleep(5 * time.Millisecond) // the poll of a wait for the gauge
	}
	gather(t, reg).want(t, "valkeystream_subscriber_read_ahead", "subscriber=billing", 0)
}

// The counters of the dead-letter middlewares, which count for the whole
// process: their growth over one published dead letter, one that could
// not be published, and one message marked for a poison queue.
func TestMiddlewareDeadLetters(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, reg := register(t, metrics.Config{})
	before := gather(t, reg)

	failing := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("always fails") }
	delivered := func() *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte("p"))
		m.Metadata.Set(valkeystream.MetadataDeliveryCount, "3")
		return m
	}
	toTopic, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 3, Topic: "orders.dead"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toTopic(failing)(delivered()); err != nil {
		t.Fatalf("dead letter not published: %v", err)
	}
	// Without a Topic and outside a router, the topic is unknown: the dead
	// letter cannot be published.
	noTopic, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noTopic(failing)(delivered()); err == nil {
		t.Fatal("a dead letter without a topic was published")
	}
	limit, err := valkeystream.DeliveryLimit(3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := limit(failing)(delivered()); !errors.Is(err, valkeystream.ErrDeliveryLimit) {
		t.Fatalf("DeliveryLimit returned %v, want ErrDeliveryLimit", err)
	}
	if n, err := client.XLen(context.Background(), "orders.dead").Result(); err != nil || n != 1 {
		t.Fatalf("orders.dead holds %d entries (%v), want 1", n, err)
	}

	after := gather(t, reg)
	for _, tc := range []struct {
		name, labels string
		want         float64
	}{
		{"valkeystream_middleware_dead_lettered_total", "middleware=DeadLetter", 1},
		{"valkeystream_middleware_dead_lettered_total", "middleware=DeliveryLimit", 1},
		{"valkeystream_middleware_dead_letter_failures_total", "", 1},
	} {
		if got := after[tc.name][tc.labels] - before[tc.name][tc.labels]; got != tc.want {
			t.Errorf("%s{%s} grew by %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// The dead-letter counters by the stream and group the messages came from:
// one source with a published dead letter, one that could not be
// published and one marked for a poison queue; another source with one
// dead letter; the totals grow by the sum.
func TestMiddlewareDeadLettersBySource(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, reg := register(t, metrics.Config{})
	before := gather(t, reg)

	orders, payments := "orders-"+watermill.NewShortUUID(), "payments-"+watermill.NewShortUUID()
	failing := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("always fails") }
	delivered := func(stream, group string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte("p"))
		m.Metadata.Set(valkeystream.MetadataDeliveryCount, "3")
		m.Metadata.Set(valkeystream.MetadataStream, stream)
		m.Metadata.Set(valkeystream.MetadataGroup, group)
		return m
	}
	toTopic, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 3, Topic: "dead"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	noTopic, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	limit, err := valkeystream.DeliveryLimit(3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toTopic(failing)(delivered(orders, "billing")); err != nil {
		t.Fatalf("dead letter not published: %v", err)
	}
	if _, err := noTopic(failing)(delivered(orders, "billing")); err == nil {
		t.Fatal("a dead letter without a topic was published")
	}
	if _, err := limit(failing)(delivered(orders, "billing")); !errors.Is(err, valkeystream.ErrDeliveryLimit) {
		t.Fatalf("DeliveryLimit returned %v, want ErrDeliveryLimit", err)
	}
	if _, err := toTopic(failing)(delivered(payments, "")); err != nil {
		t.Fatalf("dead letter not published: %v", err)
	}

	after := gather(t, reg)
	const bySource, failures = "valkeystream_middleware_dead_lettered_by_source_total", "valkeystream_middleware_dead_letter_failures_by_source_total"
	after.want(t, bySource, "group=billing,middleware=DeadLetter,stream="+orders, 1)
	after.want(t, bySource, "group=billing,middleware=DeliveryLimit,stream="+orders, 1)
	after.want(t, failures, "group=billing,stream="+orders, 1)
	after.want(t, bySource, "group=,middleware=DeadLetter,stream="+payments, 1)
	after.want(t, bySource, "group=,middleware=DeliveryLimit,stream="+payments, 0)
	after.want(t, failures, "group=,stream="+payments, 0)
	for _, tc := range []struct {
		name, labels string
		want         float64
	}{
		{"valkeystream_middleware_dead_lettered_total", "middleware=DeadLetter", 2},
		{"valkeystream_middleware_dead_lettered_total", "middleware=DeliveryLimit", 1},
		{"valkeystream_middleware_dead_letter_failures_total", "", 1},
	} {
		if got := after[tc.name][tc.labels] - before[tc.name][tc.labels]; got != tc.want {
			t.Errorf("%s{%s} grew by %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
