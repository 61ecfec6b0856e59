package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

// The delayed messages waiting beside a stream, sampled on the server: two
// published with a delay of an hour and one due 30 s ago that no mover has
// moved (no Subscriber runs); a stream without delayed messages has 0 of
// each, and one whose key cannot have them has neither.
func TestDelayedGauges(t *testing.T) {
	srv := testserver.Start(t)
	client := newClient(t, srv)
	ctx := context.Background()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		m := message.NewMessage(watermill.NewUUID(), []byte("later"))
		delay.Message(m, delay.For(time.Hour))
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
	key, err := valkeystream.DelayedKey("orders")
	if err != nil {
		t.Fatal(err)
	}
	now, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := client.ZAdd(ctx, key, redis.Z{Score: float64(now.Add(-30 * time.Second).UnixMilli()), Member: "overdue"}).Err(); err != nil {
		t.Fatal(err)
	}

	c, reg := register(t, metrics.Config{Client: client, SampleInterval: time.Hour})
	c.WatchStream("orders")
	c.WatchStream("quiet")
	c.WatchStream("a}b")
	g := gather(t, reg)
	g.want(t, "valkeystream_delayed_messages", "stream=orders", 3)
	if late := g["valkeystream_delayed_overdue_seconds"]["stream=orders"]; late < 30 || late > 600 {
		t.Errorf("valkeystream_delayed_overdue_seconds{stream=orders} = %v, want at least 30 (and less than the test's length)", late)
	}
	g.want(t, "valkeystream_delayed_messages", "stream=quiet", 0)
	g.want(t, "valkeystream_delayed_overdue_seconds", "stream=quiet", 0)
	g.want(t, "valkeystream_server_sample_errors_total", "", 0)
	if _, ok := g["valkeystream_delayed_messages"]["stream=a}b"]; ok {
		t.Error("a stream key that cannot have delayed messages has a delayed_messages gauge")
	}

	// Once the overdue one is gone, none is due.
	client.ZRem(ctx, key, "overdue")
	c.WatchStream("another") // a new target: sampled at once
	g = gather(t, reg)
	g.want(t, "valkeystream_delayed_messages", "stream=orders", 2)
	g.want(t, "valkeystream_delayed_overdue_seconds", "stream=orders", 0)
}
