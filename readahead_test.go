package valkeystream_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// publishLarge adds n messages of size bytes each in one MULTI/EXEC, so that
// one read could take them all, and returns their UUIDs.
func (e *env) publishLarge(n, size int) []string {
	e.t.Helper()
	uuids := make([]string, n)
	payload := bytes.Repeat([]byte("x"), size)
	_, err := e.client.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
		for i := range uuids {
			msg := message.NewMessage(watermill.NewUUID(), payload)
			uuids[i] = msg.UUID
			values, err := valkeystream.DefaultMarshaler{}.Marshal(e.topic, msg)
			if err != nil {
				return err
			}
			p.XAdd(context.Background(), &redis.XAddArgs{Stream: e.topic, Values: values})
		}
		return nil
	})
	require.NoError(e.t, err)
	return uuids
}

// With large entries, ReadAheadBytes bounds what a subscription holds read
// ahead even with FullBatches, which alone would read the whole backlog; and
// everything is still delivered and acknowledged. The unbounded subscription
// shows that the test can tell the two apart.
func TestReadAheadBytesBoundsLargeEntries(t *testing.T) {
	testserver.Parallel(t)
	const (
		entries = 50
		size    = 256 << 10
	)
	tests := []struct {
		name         string
		bound        int64
		maxReadAhead int64 // most entries held read ahead while one is in hand
		minReadAhead int64
	}{
		// A read takes 3 entries of a little over 256 KiB: 2 wait while
		// one is handled.
		{name: "1 MiB bound", bound: 1 << 20, maxReadAhead: 4, minReadAhead: 1},
		{name: "no bound", bound: valkeystream.NoReadAheadLimit, maxReadAhead: entries, minReadAhead: entries - 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) {
				c.PrefetchWindow = valkeystream.FullBatches
				c.ReadAheadBytes = tt.bound
			})
			msgs := e.subscribe(sub)

			// A first entry teaches the subscription their size.
			first := e.publishLarge(1, size)
			m := receive(t, msgs)
			require.Equal(t, first[0], m.UUID)
			m.Ack()

			sent := e.publishLarge(entries, size)
			m = receive(t, msgs)
			require.Equal(t, sent[0], m.UUID)
			// The handler holds the first message: the loop read once and
			// waits.
			held := sub.Stats().ReadAhead
			assert.LessOrEqual(t, held, tt.maxReadAhead, "entries read ahead while the handler holds one")
			assert.GreaterOrEqual(t, held, tt.minReadAhead, "entries read ahead while the handler holds one")

			most := held
			m.Ack()
			for i := 1; i < entries; i++ {
				m = receive(t, msgs)
				require.Equal(t, sent[i], m.UUID, "message %d", i)
				most = max(most, sub.Stats().ReadAhead)
				m.Ack()
			}
			assert.LessOrEqual(t, most, tt.maxReadAhead, "most entries read ahead during the run")
			require.NoError(t, sub.Close())
			assert.Empty(t, e.pending("g"), "every message acknowledged")
			assert.Equal(t, int64(entries+1), sub.Stats().Acked)
		})
	}
}
