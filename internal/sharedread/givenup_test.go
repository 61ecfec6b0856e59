package sharedread

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestAReadGivenUpClosesItsConnectionWhenItReturns ends a shared reader
// while its read hangs on a frozen master, so that the reader gives the
// read up (endGrace after its last member left, then bounded.Grace) and
// ends while the read goes on. On a Sentinel client the reader reads over a
// connection of the client's pool (a *redis.Conn), whose Close closes the
// channel that a call in progress sends the connection back on when it
// returns: closing it before the read returned is a data race, which -race
// reports. The reader must end without waiting for the read (a
// Subscriber's Close is bounded), and its connection must be closed once
// the read has returned.
//
// The race detector takes every write to a socket as ordered before every
// later read from one, so after the reader ended this test sends nothing
// until the reader's connection is closed: a command sent then would order
// the Close before the read's return, and hide the race. It waits for that
// Close where the connection is dialed instead.
func TestAReadGivenUpClosesItsConnectionWhenItReturns(t *testing.T) {
	testserver.Parallel(t)
	g := testserver.StartSentinel(t)
	ctx := context.Background()
	var dialed testserver.Dialed
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: testserver.SentinelMasterName, SentinelAddrs: g.SentinelAddrs(), Dialer: dialed.Dial,
	})
	t.Cleanup(func() { _ = client.Close() })
	masterAddr, err := g.Master(ctx)
	require.NoError(t, err)
	master := g.Node(masterAddr)
	require.NotNil(t, master, "no data node at the master's address %s", masterAddr)
	admin := redis.NewClient(&redis.Options{Addr: masterAddr})
	t.Cleanup(func() { _ = admin.Close() })

	key := "given-up-" + watermill.NewShortUUID()
	require.NoError(t, admin.XGroupCreateMkStream(ctx, key, "g", "$").Err())

	logger := watermill.NewCaptureLogger()
	// The block is long enough that the read found blocked below is still
	// blocked when the master is frozen.
	reg := newTestRegistry(client, 3*time.Second, logger)
	m := reg.Join(ctx, "c", key)
	require.NotNil(t, m, "no shared reader")
	r := m.r
	_, userConn := r.conn.rc.(*redis.Conn)
	require.True(t, userConn, "the shared reader of a Sentinel client reads over a %T, want a *redis.Conn of the client's pool", r.conn.rc)

	waitCtx, stopWait := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		_, _ = m.Wait(waitCtx, 10, -1)
	}()

	id := r.id()
	require.NotZero(t, id, "the reader's CLIENT ID")
	var line string
	require.Eventually(t, func() bool {
		line, err = admin.Do(ctx, "CLIENT", "LIST", "ID", id).Text()
		require.NoError(t, err)
		return strings.Contains(line, "cmd=xreadgroup")
	}, 10*time.Second, 5*time.Millisecond, "the shared read never reached the server")
	readerNet := dialed.Find(t, testserver.ClientField(line, "addr"))

	require.NoError(t, master.Freeze())
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			require.NoError(t, master.Thaw())
		}
	}
	defer thaw()
	stopWait()
	<-waited
	m.Leave() // the last member: the reader ends, and its interrupt waits on the frozen server
	select {
	case <-r.sig.done:
	case <-time.After(30 * time.Second): // a bound against a hang, not a measure
		t.Fatal("the reader did not end while its read hung: a Subscriber's Close would wait for the read")
	}
	require.True(t, logger.HasError(context.Canceled),
		"the reader did not log that it gave its read up: the read did not outlive its bound")

	// The read returns once the server runs the interrupt it holds (or at
	// its block time). Nothing is sent until the connection is closed.
	thaw()
	select {
	case <-readerNet.Closed():
	case <-time.After(30 * time.Second): // a bound against a hang, not a measure
		t.Fatalf("the reader's connection (CLIENT ID %d) was not closed after its read returned", id)
	}
	reg.goroutines.Wait()
}
