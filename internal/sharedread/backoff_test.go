package sharedread

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/loop"
	"github.com/echomq/valkeystream/internal/testserver"
)

// TestAFailingSharedReadIsLoggedOnceAndBacksOff keeps a member waiting
// again at once after every failed wait, as no loop does, while the server
// is down: only the reader's own backoff paces its reads then. A client of
// one connection answers every dial with the error of its last one for a
// second or so after the server is back (go-redis), so without the backoff
// the reader sends thousands of reads, and each failure was once logged at
// Error by every subscription it read for. The failures reach the member
// marked as the reader's (loop.ErrSharedRead), the reader logs one Error
// line for the streak, and reads again when the server is back.
func TestAFailingSharedReadIsLoggedOnceAndBacksOff(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	if !srv.Restartable() {
		t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be stopped by the test")
	}
	ctx := context.Background()
	// Neither retries nor redials by itself: every failed read reaches the
	// reader.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	key := "failing-read-" + watermill.NewShortUUID()
	require.NoError(t, admin.XGroupCreateMkStream(ctx, key, "g", "$").Err())

	logger := watermill.NewCaptureLogger()
	reg := newTestRegistry(client, 200*time.Millisecond, logger)
	m := reg.Join(ctx, "c", key)
	require.NotNil(t, m, "no shared reader")

	var failed atomic.Int64
	var otherErr atomic.Value
	got := make(chan []loop.Entry, 1)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		for waitCtx.Err() == nil {
			w, err := m.Wait(waitCtx, 10, 100*time.Millisecond)
			switch {
			case err != nil && !errors.Is(err, loop.ErrSharedRead):
				otherErr.Store(err)
				return
			case err != nil:
				failed.Add(1)
			case len(w.Entries) > 0:
				got <- w.Entries
				return
			}
		}
	}()
	defer func() {
		stopWaiting()
		<-waiting
		m.Leave()
		reg.goroutines.Wait()
	}()

	require.NoError(t, srv.Kill())
	// The outage lasts until the reader has failed four times, so that it
	// has backed off twice (100 and 200 ms).
	require.Eventually(t, func() bool { return failed.Load() >= 4 }, 30*time.Second, 10*time.Millisecond,
		"the reader did not fail four times while the server was down")
	require.NoError(t, srv.StartAgain())
	id, err := admin.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"k", "v"}}).Result()
	require.NoError(t, err)
	select {
	case es := <-got:
		require.Len(t, es, 1)
		assert.Equal(t, id, es[0].ID)
	case <-time.After(30 * time.Second):
		t.Fatalf("the entry added after the outage never came (failed waits: %d, other error: %v)", failed.Load(), otherErr.Load())
	}
	require.Nil(t, otherErr.Load(), "a failure not marked as the shared read's")

	n := failed.Load()
	t.Logf("failed waits: %d", n)
	assert.GreaterOrEqual(t, n, int64(1), "the outage failed no read")
	// Backoffs of 0, 100 ms, 200 ms, ... doubling to 5 s: four reads in the
	// outage and a few in the second after it, while the client answers
	// with its last dial error; a few more on a slow machine.
	assert.LessOrEqual(t, n, int64(15), "reads sent while the server was down: the reader must back off")
	var errorLines []string
	for _, l := range logger.Captured()[watermill.ErrorLogLevel] {
		errorLines = append(errorLines, l.Msg)
	}
	assert.Len(t, errorLines, 1, "Error lines of one streak of failed reads:\n%s", strings.Join(errorLines, "\n"))
	resumed := false
	for _, l := range logger.Captured()[watermill.InfoLogLevel] {
		resumed = resumed || l.Msg == "The shared read resumed"
	}
	assert.True(t, resumed, "no line says that the shared read resumed")
}
