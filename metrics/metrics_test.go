package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

func newClient(t testing.TB, srv *testserver.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// gathered is what a registry's Gather returned, by metric name and then by
// label values joined with ",".
type gathered map[string]map[string]float64

func gather(t *testing.T, reg *prometheus.Registry) gathered {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	out := gathered{}
	for _, f := range families {
		byLabels := map[string]float64{}
		for _, m := range f.GetMetric() {
			var values []string
			for _, l := range m.GetLabel() {
				values = append(values, l.GetName()+"="+l.GetValue())
			}
			byLabels[strings.Join(values, ",")] = value(m)
		}
		out[f.GetName()] = byLabels
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// want checks one metric's value.
func (g gathered) want(t *testing.T, name, labels string, want float64) {
	t.Helper()
	got, ok := g[name][labels]
	if !ok {
		t.Errorf("%s{%s} missing; have %v", name, labels, g[name])
		return
	}
	if got != want {
		t.Errorf("%s{%s} = %v, want %v", name, labels, got, want)
	}
}

// wantLag checks a group's lag gauge: the value on servers that report lag
// (Redis 7.0 and later, Valkey), absent on Redis 6.2, whose XINFO GROUPS has
// none.
func (g gathered) wantLag(t *testing.T, client redis.UniversalClient, labels string, want float64) {
	t.Helper()
	info, err := client.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info, "redis_version:6.") {
		if got, ok := g["valkeystream_group_lag"][labels]; ok {
			t.Errorf("valkeystream_group_lag{%s} = %v on a server that reports no lag, want it absent", labels, got)
		}
		return
	}
	g.want(t, "valkeystream_group_lag", labels, want)
}

func register(t *testing.T, config metrics.Config) (*metrics.Collector, *prometheus.Registry) {
	t.Helper()
	c, err := metrics.NewCollector(config)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// The server gauges after known operations: 5 entries, c1 has read 3 (the
// first claimed again, so delivered twice), c2 has read 1, one is unread,
// and the dead-letter stream holds 2.
func TestServerGauges(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"uuid", fmt.Sprint(i), "payload", "p"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	client.XAdd(ctx, &redis.XAddArgs{Stream: "s.dead", Values: []any{"uuid", "d1", "payload", ""}})
	client.XAdd(ctx, &redis.XAddArgs{Stream: "s.dead", Values: []any{"uuid", "d2", "payload", ""}})
	if err := client.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{"s", ">"}, Count: 3, Block: -1})
	client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c2", Streams: []string{"s", ">"}, Count: 1, Block: -1})
	if err := client.XClaim(ctx, &redis.XClaimArgs{Stream: "s", Group: "g", Consumer: "c1", Messages: []string{ids[0]}}).Err(); err != nil {
		t.Fatal(err)
	}

	c, reg := register(t, metrics.Config{Client: client, SampleInterval: time.Hour})
	c.WatchGroup("s", "g")
	c.WatchGroup("s", "missing-group")
	c.WatchStream("no-such-stream")
	g := gather(t, reg)
	g.want(t, "valkeystream_stream_length", "stream=s", 5)
	g.want(t, "valkeystream_dead_letters", "stream=s", 2)
	g.want(t, "valkeystream_stream_length", "stream=no-such-stream", 0)
	g.wantLag(t, client, "group=g,stream=s", 1)
	g.want(t, "valkeystream_group_pending", "group=g,stream=s", 4)
	g.want(t, "valkeystream_group_consumers", "group=g,stream=s", 2)
	g.want(t, "valkeystream_group_max_deliveries", "group=g,stream=s", 2)
	g.want(t, "valkeystream_consumer_pending", "consumer=c1,group=g,stream=s", 3)
	g.want(t, "valkeystream_consumer_pending", "consumer=c2,group=g,stream=s", 1)
	g.want(t, "valkeystream_server_samples_total", "", 1)
	g.want(t, "valkeystream_server_sample_errors_total", "", 0)
	if age := g["valkeystream_group_oldest_pending_age_seconds"]["group=g,stream=s"]; age < 0 || age > 600 {
		t.Errorf("oldest pending age %v s, want between 0 and the test's length", age)
	}
	if idle, ok := g["valkeystream_consumer_idle_seconds"]["consumer=c2,group=g,stream=s"]; !ok || idle < 0 {
		t.Errorf("consumer c2 idle %v (present %v), want a non-negative value", idle, ok)
	}
	if n := len(g["valkeystream_group_pending"]); n != 1 {
		t.Errorf("%d groups reported, want 1: a group that does not exist has no metrics", n)
	}

	// Within the interval a scrape reuses the sample: no new round trip,
	// the old length.
	client.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"uuid", "5", "payload", "p"}})
	g = gather(t, reg)
	g.want(t, "valkeystream_server_samples_total", "", 1)
	g.want(t, "valkeystream_stream_length", "stream=s", 5)

	// A new target is sampled at once.
	c.WatchStream("s.dead")
	g = gather(t, reg)
	g.want(t, "valkeystream_server_samples_total", "", 2)
	g.want(t, "valkeystream_stream_length", "stream=s", 6)
	g.want(t, "valkeystream_stream_length", "stream=s.dead", 2)

	// A key of another type fails the sample, which says so.
	client.Set(ctx, "a-string", "x", 0)
	c.WatchStream("a-string")
	g = gather(t, reg)
	g.want(t, "valkeystream_server_sample_errors_total", "", 1)
	if _, ok := g["valkeystream_stream_length"]["stream=a-string"]; ok {
		t.Error("a key of another type has a stream length")
	}
}

// A subscriber's counters, its subscriptions and the groups it reads, and a
// publisher's counters, through the registry.
func TestSubscriberAndPublisher(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "billing", Consumer: "w1", Start: valkeystream.StartHead,
		NackResendDelay: time.Millisecond, AckFlushInterval: time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c, reg := register(t, metrics.Config{Client: client, SampleInterval: time.Nanosecond})
	if err := c.AddSubscriber("billing", sub); err != nil {
		t.Fatal(err)
	}
	if err := c.AddSubscriber("billing", sub); err == nil || !strings.Contains(err.Error(), `"billing" is registered already`) {
		t.Errorf("second AddSubscriber with one name: %v, want an error", err)
	}
	if err := c.AddPublisher("orders", pub); err != nil {
		t.Fatal(err)
	}

	const n = 10
	for i := range n {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	// The first message is Nacked twice; each redelivery waits the fixed
	// NackResendDelay.
	nacks := 0
	for acked := 0; acked < n; {
		select {
		case m := <-msgs:
			if nacks < 2 {
				nacks++
				m.Nack()
				continue
			}
			m.Ack()
			acked++
		case <-ctx.Done():
			t.Fatal("timed out consuming")
		}
	}
	for sub.Stats().Acked < n { // Acks are sent in the background
		select {
		case <-ctx.Done():
			t.Fatalf("acked %d, want %d", sub.Stats().Acked, n)
		case <-time.After(5 * time.Millisecond):
		}
	}

	g := gather(t, reg)
	st := sub.Stats()
	g.want(t, "valkeystream_subscriber_delivered_total", "subscriber=billing", float64(st.Delivered))
	g.want(t, "valkeystream_subscriber_acked_total", "subscriber=billing", n)
	g.want(t, "valkeystream_subscriber_nacked_total", "subscriber=billing", 2)
	g.want(t, "valkeystream_subscriber_nack_waits_total", "subscriber=billing", 2)
	g.want(t, "valkeystream_subscriber_nack_wait_seconds_total", "subscriber=billing", 2*time.Millisecond.Seconds())
	g.want(t, "valkeystream_subscriber_faults_total", "subscriber=billing", 0)
	g.want(t, "valkeystream_subscriber_verbs_info", "subscriber=billing,verbs="+st.Verbs, 1)
	if st.Verbs == "" {
		t.Error("Stats.Verbs is empty after a group Subscribe")
	}
	if st.Delivered != n+2 {
		t.Errorf("delivered %d, want %d (two redeliveries after the Nacks)", st.Delivered, n+2)
	}
	labels := "consumer=w1,group=billing,stream=orders,subscriber=billing"
	g.want(t, "valkeystream_subscription_running", labels, 1)
	g.want(t, "valkeystream_subscription_ready", labels, 1)
	g.want(t, "valkeystream_subscription_failing_seconds", labels, 0)
	// The group the subscriber reads is sampled without being watched.
	g.want(t, "valkeystream_stream_length", "stream=orders", n)
	g.want(t, "valkeystream_group_pending", "group=billing,stream=orders", 0)
	g.wantLag(t, client, "group=billing,stream=orders", 0)
	g.want(t, "valkeystream_group_oldest_pending_age_seconds", "group=billing,stream=orders", 0)

	// The exposition format, as Prometheus reads it.
	expected := fmt.Sprintf(`
# HELP valkeystream_publisher_calls_total Publish calls.
# TYPE valkeystream_publisher_calls_total counter
valkeystream_publisher_calls_total{publisher="orders"} %d
# HELP valkeystream_subscriber_nacked_total Messages Nacked by handlers.
# TYPE valkeystream_subscriber_nacked_total counter
valkeystream_subscriber_nacked_total{subscriber="billing"} 2
`, n)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"valkeystream_publisher_calls_total", "valkeystream_subscriber_nacked_total"); err != nil {
		t.Error(err)
	}
	g.want(t, "valkeystream_publisher_calls_total", "publisher=orders", n)
	g.want(t, "valkeystream_publisher_messages_total", "publisher=orders", n)
	g.want(t, "valkeystream_publisher_failed_calls_total", "publisher=orders", 0)
	g.want(t, "valkeystream_publisher_round_trips_total", "publisher=orders", n)
	g.want(t, "valkeystream_publisher_round_trip_messages_total", "publisher=orders", n)

	cancel()
	for range msgs {
	}
	// The state is updated as the loop's goroutine returns, just after the
	// channel is closed.
	deadline := time.Now().Add(time.Minute)
	for gather(t, reg)["valkeystream_subscription_running"][labels] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("subscription_running still 1 a minute after the subscription ended")
		}
		time.Sleep(5 * time.Millisecond) // the poll of a wait for the gauge
	}
}

// The metric names follow Prometheus conventions.
func TestLint(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	client.XAdd(context.Background(), &redis.XAddArgs{Stream: "s", Values: []any{"uuid", "1", "payload", "p"}})
	client.XGroupCreate(context.Background(), "s", "g", "0")
	client.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{"s", ">"}, Block: -1})
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: client, ConsumerGroup: "g", Start: valkeystream.StartNew}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := metrics.NewCollector(metrics.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	c.AddSubscriber("s", sub)
	c.AddPublisher("p", pub)
	c.WatchGroup("s", "g")
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(c); n < 20 {
		t.Errorf("collected %d metrics, want at least 20", n)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		config metrics.Config
		want   string
	}{
		{"negative interval", metrics.Config{SampleInterval: -1}, "SampleInterval"},
		{"negative timeout", metrics.Config{SampleTimeout: -1}, "SampleTimeout"},
		{"negative scan", metrics.Config{MaxPendingScan: -1}, "MaxPendingScan"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := metrics.NewCollector(tc.config)
			if !errors.Is(err, valkeystream.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an ErrInvalidConfig naming %s", err, tc.want)
			}
		})
	}
}

// The counters of the handlers' verdicts: a message Nacked to come back
// later (the Deferred gauge while it waits, 0 once handed back by Close),
// and one given up.
func TestVerdictCounters(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "billing", Consumer: "w1", Start: valkeystream.StartHead,
		AckFlushInterval: time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c, reg := register(t, metrics.Config{})
	if err := c.AddSubscriber("billing", sub); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	next := func() *message.Message {
		select {
		case m := <-msgs:
			return m
		case <-ctx.Done():
			t.Fatal("timed out consuming")
			return nil
		}
	}
	first := next()
	valkeystream.NackAfter(first, time.Hour)
	second := next() // delivered while the first waits
	g := gather(t, reg)
	g.want(t, "valkeystream_subscriber_deferred", "subscriber=billing", 1)
	g.want(t, "valkeystream_subscriber_retries_later_total", "subscriber=billing", 1)
	valkeystream.Reject(second, errors.New("malformed"))
	for sub.Stats().Acked < 1 {
		select {
		case <-ctx.Done():
			t.Fatalf("acked %d, want 1", sub.Stats().Acked)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	g = gather(t, reg)
	g.want(t, "valkeystream_subscriber_deferred", "subscriber=billing", 0)
	g.want(t, "valkeystream_subscriber_given_up_total", "subscriber=billing", 1)
	g.want(t, "valkeystream_subscriber_retry_later_fallbacks_total", "subscriber=billing", 0)
}
