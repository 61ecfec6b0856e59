package compat

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
)

// receiveTimeout bounds every wait for a message that must arrive: a
// deadline for a hang, not a speed requirement.
const receiveTimeout = 30 * time.Second

// testMessages returns n messages with the variety a live stream has: some
// with metadata (short and long keys and values, binary values, a map of
// more than 15 keys), some with empty payloads, some with binary payloads.
// The same seed gives the same messages, UUIDs apart.
func testMessages(n int, seed uint64) []*message.Message {
	rnd := rand.New(rand.NewPCG(seed, seed))
	msgs := make([]*message.Message, n)
	for i := range msgs {
		var payload []byte
		switch {
		case i%5 == 0: // empty
		case i%7 == 0:
			payload = make([]byte, 1+rnd.IntN(200))
			for j := range payload {
				payload[j] = byte(rnd.UintN(256))
			}
		default:
			payload = fmt.Appendf(nil, `{"n":%d}`, i)
		}
		msg := message.NewMessage(watermill.NewUUID(), payload)
		if i%4 == 0 {
			msg.Metadata.Set("trace_id", watermill.NewShortUUID())
			msg.Metadata.Set("n", fmt.Sprint(i))
		}
		if i%8 == 0 {
			msg.Metadata.Set(strings.Repeat("k", 40), strings.Repeat("v", 300)) // str 8 key, str 16 value
			msg.Metadata.Set("binary", "\xff\x00\xfe")
			msg.Metadata.Set("empty", "")
		}
		if i%50 == 0 {
			for j := range 20 { // a map 16
				msg.Metadata.Set(fmt.Sprint("key-", j), fmt.Sprint(j))
			}
		}
		if i == 100 {
			msg.Metadata.Set("large", strings.Repeat("x", 70000)) // str 32
		}
		msgs[i] = msg
	}
	return msgs
}

// userMetadata returns msg's metadata without the keys a valkeystream
// Subscriber sets on delivery.
func userMetadata(msg *message.Message) map[string]string {
	md := map[string]string{}
	for k, v := range msg.Metadata {
		if !strings.HasPrefix(k, "valkeystream_") {
			md[k] = v
		}
	}
	return md
}

// requireSameMessage fails unless got carries want's UUID, payload and
// metadata (delivery keys aside).
func requireSameMessage(t *testing.T, want, got *message.Message, what string) {
	t.Helper()
	require.Equal(t, want.UUID, got.UUID, "%s: UUID", what)
	require.Equal(t, string(want.Payload), string(got.Payload), "%s: payload of %s", what, want.UUID)
	wantMD, gotMD := userMetadata(want), userMetadata(got)
	require.True(t, maps.Equal(wantMD, gotMD), "%s: metadata of %s: got %q, want %q", what, want.UUID, gotMD, wantMD)
}

func newIncumbentPublisher(t *testing.T) *redisstream.Publisher {
	t.Helper()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: newClient(t)}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func newPublisher(t *testing.T, m valkeystream.Marshaler) *valkeystream.Publisher {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: newClient(t), Marshaler: m}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// newSubscriber returns a valkeystream consumer-group Subscriber with the
// default Unmarshaler and quick timings, closed when the test ends.
func newSubscriber(t *testing.T, group, consumer string, edit ...func(*valkeystream.SubscriberConfig)) *valkeystream.Subscriber {
	t.Helper()
	cfg := valkeystream.SubscriberConfig{
		Client:           newClient(t),
		ConsumerGroup:    group,
		Consumer:         consumer,
		Start:            valkeystream.StartHead,
		BlockTime:        50 * time.Millisecond,
		AckFlushInterval: 10 * time.Millisecond,
	}
	for _, f := range edit {
		f(&cfg)
	}
	sub, err := valkeystream.NewSubscriber(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// newIncumbentSubscriber returns a watermill-redisstream consumer-group
// Subscriber with its default, random consumer name.
func newIncumbentSubscriber(t *testing.T, group string) *redisstream.Subscriber {
	t.Helper()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        newClient(t),
		ConsumerGroup:                 group,
		OldestId:                      "0",
		DisableIndefiniteInitialBlock: true,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-msgs:
		require.True(t, ok, "the channel closed, want a message")
		return m
	case <-time.After(receiveTimeout):
		t.Fatalf("no message within %s", receiveTimeout)
		return nil
	}
}

// entries returns the fields of every entry of key, in stream order.
func entries(t *testing.T, c redis.UniversalClient, key string) []redis.XMessage {
	t.Helper()
	all, err := c.XRange(context.Background(), key, "-", "+").Result()
	require.NoError(t, err)
	return all
}

func topicName() string { return "compat-" + watermill.NewShortUUID() }
