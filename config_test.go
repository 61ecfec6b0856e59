package valkeystream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
)

func TestSubscriberConfigValidate(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	valid := func() valkeystream.SubscriberConfig {
		return valkeystream.SubscriberConfig{Client: client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartNew}
	}
	tests := []struct {
		name string
		edit func(*valkeystream.SubscriberConfig)
		want []string // substrings of the error; none means valid
	}{
		{name: "valid", edit: func(*valkeystream.SubscriberConfig) {}},
		{name: "fan-out needs no consumer", edit: func(c *valkeystream.SubscriberConfig) { c.ConsumerGroup, c.Consumer = "", "" }},
		{name: "no client", edit: func(c *valkeystream.SubscriberConfig) { c.Client = nil }, want: []string{"Client"}},
		{name: "no declared start", edit: func(c *valkeystream.SubscriberConfig) { c.Start = 0 },
			want: []string{"Start is not set", "StartNew ($", "StartHead (0"}},
		{name: "unknown start", edit: func(c *valkeystream.SubscriberConfig) { c.Start = 7 },
			want: []string{"StartPosition(7)", "StartNew", "StartHead"}},
		{name: "fan-out needs a start too", edit: func(c *valkeystream.SubscriberConfig) { c.ConsumerGroup, c.Start = "", 0 },
			want: []string{"Start"}},
		{name: "prefix with hash tag", edit: func(c *valkeystream.SubscriberConfig) { c.KeyPrefix = "{app}:" }, want: []string{"KeyPrefix", "hash slot"}},
		{name: "negative batch", edit: func(c *valkeystream.SubscriberConfig) { c.BatchSize = -1 }, want: []string{"BatchSize"}},
		{name: "block below a millisecond", edit: func(c *valkeystream.SubscriberConfig) { c.BlockTime = time.Microsecond }, want: []string{"BlockTime", "1ms"}},
		{name: "negative claim interval", edit: func(c *valkeystream.SubscriberConfig) { c.ClaimInterval = -time.Second }, want: []string{"ClaimInterval", "NoReclaim (-1)"}},
		{name: "claim interval below a millisecond", edit: func(c *valkeystream.SubscriberConfig) { c.ClaimInterval = 5 }, want: []string{"ClaimInterval is 5ns", "1ms"}},
		{name: "negative nack delay", edit: func(c *valkeystream.SubscriberConfig) { c.NackResendDelay = -time.Second }, want: []string{"NackResendDelay", "NackAtOnce (-1)"}},
		{name: "negative ack flush", edit: func(c *valkeystream.SubscriberConfig) { c.AckFlushInterval = -time.Second }, want: []string{"AckFlushInterval", "AckAtOnce (-1)"}},
		{name: "acks at once", edit: func(c *valkeystream.SubscriberConfig) { c.AckFlushInterval = valkeystream.AckAtOnce }},
		{name: "nacks at once", edit: func(c *valkeystream.SubscriberConfig) { c.NackResendDelay = valkeystream.NackAtOnce }},
		{name: "no claim beat", edit: func(c *valkeystream.SubscriberConfig) { c.ClaimInterval = valkeystream.NoReclaim }},
		{name: "no dead letters", edit: func(c *valkeystream.SubscriberConfig) { c.DeadLetterSuffix = valkeystream.NoDeadLetter }},
		{name: "full batches", edit: func(c *valkeystream.SubscriberConfig) { c.PrefetchWindow = valkeystream.FullBatches }},
		{name: "negative prefetch window", edit: func(c *valkeystream.SubscriberConfig) { c.PrefetchWindow = -time.Second }, want: []string{"PrefetchWindow", "FullBatches (-1)"}},
		{name: "no read-ahead byte bound", edit: func(c *valkeystream.SubscriberConfig) { c.ReadAheadBytes = valkeystream.NoReadAheadLimit }},
		{name: "small read-ahead byte bound", edit: func(c *valkeystream.SubscriberConfig) { c.ReadAheadBytes = 1 }},
		{name: "negative read-ahead bytes", edit: func(c *valkeystream.SubscriberConfig) { c.ReadAheadBytes = -2 }, want: []string{"ReadAheadBytes is -2", "NoReadAheadLimit (-1)"}},
		{name: "no close grace", edit: func(c *valkeystream.SubscriberConfig) { c.CloseGrace = valkeystream.NoCloseGrace }},
		{name: "negative close grace", edit: func(c *valkeystream.SubscriberConfig) { c.CloseGrace = -time.Second }, want: []string{"CloseGrace", "NoCloseGrace (-1)"}},
		{name: "negative nack backoff cap", edit: func(c *valkeystream.SubscriberConfig) { c.NackBackoffMax = -time.Second }, want: []string{"NackBackoffMax"}},
		{name: "min idle not above block", edit: func(c *valkeystream.SubscriberConfig) {
			c.BlockTime, c.ClaimMinIdle = 2*time.Second, time.Second
		}, want: []string{"ClaimMinIdle (1s)", "BlockTime (2s)"}},
		{name: "min idle not above ack flush", edit: func(c *valkeystream.SubscriberConfig) {
			c.AckFlushInterval, c.ClaimMinIdle = time.Minute, 30*time.Second
		}, want: []string{"ClaimMinIdle", "AckFlushInterval (1m0s)"}},
		{name: "lease too short", edit: func(c *valkeystream.SubscriberConfig) { c.ConsumerLeaseTTL = 50 * time.Millisecond },
			want: []string{"ConsumerLeaseTTL is 50ms", "at least 100ms"}},
		{name: "consumer removal before reclaim", edit: func(c *valkeystream.SubscriberConfig) {
			c.RemoveIdleConsumersAfter = 10 * time.Second
		}, want: []string{"RemoveIdleConsumersAfter (10s)", "ClaimMinIdle (30s)", "NeverRemoveConsumers"}},
		{name: "consumer removal negative", edit: func(c *valkeystream.SubscriberConfig) { c.RemoveIdleConsumersAfter = -time.Second },
			want: []string{"RemoveIdleConsumersAfter"}},
		{name: "consumers never removed", edit: func(c *valkeystream.SubscriberConfig) { c.RemoveIdleConsumersAfter = valkeystream.NeverRemoveConsumers }},
		{name: "default removal follows ClaimMinIdle", edit: func(c *valkeystream.SubscriberConfig) { c.ClaimMinIdle = 10 * time.Minute }},
		{name: "with Partitions the claim fields wait for a plain topic", edit: func(c *valkeystream.SubscriberConfig) {
			c.Partitions = map[string]int{"orders": 4}
			c.BlockTime, c.ClaimMinIdle, c.RemoveIdleConsumersAfter = 2*time.Second, time.Second, 500*time.Millisecond
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.edit(&cfg)
			err := cfg.Validate()
			_, newErr := valkeystream.NewSubscriber(cfg, nil)
			if len(tt.want) == 0 {
				assert.NoError(t, err)
				assert.NoError(t, newErr)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
			assert.ErrorIs(t, newErr, valkeystream.ErrInvalidConfig, "NewSubscriber must fail in the caller's goroutine")
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// The claim fields of a Subscriber that declares Partitions are checked
// when it subscribes to a plain topic, whose subscription claims, before
// anything is sent (the client here is never dialled).
func TestClaimFieldsAreCheckedAtTheSubscribeOfAPlainTopic(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartNew,
		Partitions: map[string]int{"orders": 4}, BlockTime: 2 * time.Second, ClaimMinIdle: time.Second,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Subscribe(context.Background(), "payments")
	require.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "ClaimMinIdle (1s) must exceed BlockTime (2s)")
	assert.Contains(t, err.Error(), `topic "payments" is not one of Partitions`)
}

func TestPublisherConfigValidate(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	slow := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: time.Second})
	slowCluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ReadTimeout: 500 * time.Millisecond})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() {
		_ = ring.Close()
		_ = client.Close()
		_ = slow.Close()
		_ = slowCluster.Close()
	})
	tests := []struct {
		name string
		cfg  valkeystream.PublisherConfig
		want string
	}{
		{name: "valid", cfg: valkeystream.PublisherConfig{Client: client, Retention: map[string]valkeystream.Retention{"a": {MaxLen: 10}, "b": {MaxAge: time.Hour, DropUnacknowledged: true}}}},
		{name: "no client", cfg: valkeystream.PublisherConfig{}, want: "Client"},
		{name: "prefix with brace", cfg: valkeystream.PublisherConfig{Client: client, KeyPrefix: "a}"}, want: "KeyPrefix"},
		{name: "both limits", cfg: valkeystream.PublisherConfig{Client: client, Retention: map[string]valkeystream.Retention{"t": {MaxLen: 1, MaxAge: time.Hour}}},
			want: `Retention["t"] sets both`},
		{name: "negative", cfg: valkeystream.PublisherConfig{Client: client, Retention: map[string]valkeystream.Retention{"t": {MaxLen: -1}}},
			want: `Retention["t"] is negative`},
		{name: "wait with the default timeout", cfg: valkeystream.PublisherConfig{Client: client, WaitReplicas: 1}},
		{name: "wait", cfg: valkeystream.PublisherConfig{Client: client, WaitReplicas: 2, WaitTimeout: 2 * time.Second}},
		{name: "negative WaitReplicas", cfg: valkeystream.PublisherConfig{Client: client, WaitReplicas: -1}, want: "WaitReplicas is -1"},
		{name: "negative WaitTimeout", cfg: valkeystream.PublisherConfig{Client: client, WaitReplicas: 1, WaitTimeout: -time.Second}, want: "WaitTimeout is -1s"},
		{name: "WaitTimeout under 1ms", cfg: valkeystream.PublisherConfig{Client: client, WaitReplicas: 1, WaitTimeout: time.Microsecond}, want: "WaitTimeout is 1µs"},
		{name: "WaitTimeout beyond ReadTimeout", cfg: valkeystream.PublisherConfig{Client: slow, WaitReplicas: 1, WaitTimeout: 2 * time.Second},
			want: "WaitTimeout (2s) must be below the client's ReadTimeout (1s)"},
		{name: "idempotent", cfg: valkeystream.PublisherConfig{Client: client, IdempotentWindow: time.Second}},
		{name: "idempotent for a day", cfg: valkeystream.PublisherConfig{Client: client, IdempotentWindow: valkeystream.MaxIdempotentWindow}},
		{name: "negative IdempotentWindow", cfg: valkeystream.PublisherConfig{Client: client, IdempotentWindow: -time.Second}, want: "IdempotentWindow is -1s"},
		{name: "IdempotentWindow under 1s", cfg: valkeystream.PublisherConfig{Client: client, IdempotentWindow: 999 * time.Millisecond}, want: "IdempotentWindow is 999ms: it must be at least 1s"},
		{name: "IdempotentWindow over a day", cfg: valkeystream.PublisherConfig{Client: client, IdempotentWindow: 25 * time.Hour}, want: "IdempotentWindow is 25h0m0s: it must be at most 24h0m0s"},
		{name: "wait on a ring", cfg: valkeystream.PublisherConfig{Client: ring, WaitReplicas: 1}, want: "WaitReplicas is 1 with a redis.Ring client"},
		{name: "WaitTimeout beyond a cluster's ReadTimeout", cfg: valkeystream.PublisherConfig{Client: slowCluster, WaitReplicas: 1},
			want: "WaitTimeout (1s) must be below the client's ReadTimeout (500ms)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			_, newErr := valkeystream.NewPublisher(tt.cfg, nil)
			if tt.want == "" {
				assert.NoError(t, err)
				assert.NoError(t, newErr)
				return
			}
			assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig)
			assert.ErrorIs(t, newErr, valkeystream.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestParseStartPosition(t *testing.T) {
	for in, want := range map[string]valkeystream.StartPosition{
		"new": valkeystream.StartNew, "$": valkeystream.StartNew, " NEW ": valkeystream.StartNew,
		"head": valkeystream.StartHead, "0": valkeystream.StartHead,
	} {
		got, err := valkeystream.ParseStartPosition(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	_, err := valkeystream.ParseStartPosition("latest")
	assert.True(t, errors.Is(err, valkeystream.ErrInvalidConfig))
	assert.ErrorContains(t, err, `"new"`)
	assert.ErrorContains(t, err, `"head"`)
	assert.Equal(t, "new", valkeystream.StartNew.String())
	assert.Equal(t, "head", valkeystream.StartHead.String())
}

func TestStartPositionText(t *testing.T) {
	for _, p := range []valkeystream.StartPosition{valkeystream.StartNew, valkeystream.StartHead} {
		text, err := p.MarshalText()
		require.NoError(t, err)
		var got valkeystream.StartPosition
		require.NoError(t, got.UnmarshalText(text))
		if got != p {
			t.Errorf("%s written as %q reads back as %s", p, text, got)
		}
	}
	_, err := valkeystream.StartPosition(0).MarshalText()
	assert.ErrorIs(t, err, valkeystream.ErrInvalidConfig, "the zero value is not a position")
	var p valkeystream.StartPosition
	assert.ErrorIs(t, p.UnmarshalText([]byte("tail")), valkeystream.ErrInvalidConfig)
	assert.Equal(t, valkeystream.StartPosition(0), p, "a failed read leaves the value alone")
}
