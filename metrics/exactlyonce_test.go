package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

// An ExactlyOnce's counters after one committed step with two outputs and
// two state writes, and one refused handling.
func TestExactlyOnceCounters(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, reg := register(t, metrics.Config{})
	if err := c.AddExactlyOnce("enrich", x); err != nil {
		t.Fatal(err)
	}
	if err := c.AddExactlyOnce("enrich", x); err == nil {
		t.Error("second AddExactlyOnce with one name: no error")
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, ConsumerGroup: "g", Start: valkeystream.StartHead}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "in")
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("in", message.NewMessage(watermill.NewUUID(), []byte("p"))); err != nil {
		t.Fatal(err)
	}
	var in *message.Message
	select {
	case in = <-msgs:
	case <-ctx.Done():
		t.Fatal("no message")
	}
	_, err = x.Middleware(func(m *message.Message) ([]*message.Message, error) {
		step, err := valkeystream.StepOf(m.Context())
		if err != nil {
			return nil, err
		}
		if err := step.IncrBy("count", 1); err != nil {
			return nil, err
		}
		if err := step.HSet("last", "uuid", m.UUID); err != nil {
			return nil, err
		}
		for range 2 {
			out := message.NewMessage(watermill.NewUUID(), nil)
			out.SetContext(m.Context())
			if err := pub.Publish("out", out); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Ack()
	if _, err := x.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("x", nil)); err == nil {
		t.Fatal("a message not delivered by a consumer group: no error")
	}
	g := gather(t, reg)
	for name, v := range map[string]float64{
		"valkeystream_exactly_once_committed_total":      1,
		"valkeystream_exactly_once_outputs_total":        2,
		"valkeystream_exactly_once_refused_total":        1,
		"valkeystream_exactly_once_superseded_total":     0,
		"valkeystream_exactly_once_failed_total":         0,
		"valkeystream_exactly_once_non_atomic_total":     0,
		"valkeystream_exactly_once_not_replicated_total": 0,
		"valkeystream_exactly_once_state_writes_total":   2,
		"valkeystream_exactly_once_state_changed_total":  0,
	} {
		g.want(t, name, "exactly_once=enrich", v)
	}
}
