package loop

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestInterruptDuringAGivenUpReadClosesTheConnectionWhenTheReadReturns ends
// a subscription's blocking read on a Sentinel client while the read hangs
// on a frozen master: Block stops waiting for it (bounded.Grace after its
// context is cancelled) and the read goes on; then the subscription
// interrupts its server. On a Sentinel client the reads go over a
// connection of the client's pool (a *redis.Conn), whose Close closes the
// channel that a call in progress sends the connection back on when it
// returns: closing it before the read returned is a data race, which -race
// reports. Interrupt must return without waiting for the read, the
// connection must be closed once the read has returned, and the
// interrupted server must start no read after it.
//
// The race detector takes every write to a socket as ordered before every
// later read from one, so between the Interrupt and the close of the
// reader's connection this test sends nothing: a command sent then would
// order the Close before the read's return, and hide the race. It waits
// for that close where the connection is dialed instead.
func TestInterruptDuringAGivenUpReadClosesTheConnectionWhenTheReadReturns(t *testing.T) {
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

	key := "interrupted-" + watermill.NewShortUUID()
	require.NoError(t, admin.XGroupCreateMkStream(ctx, key, "g", "$").Err())
	// The block is long enough that the read found blocked below is still
	// blocked when the master is frozen.
	const block = 3 * time.Second
	s := NewRedisServer(client, RedisServerOptions{Key: key, Group: "g", Consumer: "c", BlockTime: block})
	require.False(t, s.ownReader, "the reader of a Sentinel client is its own: want a connection of the client's pool")

	readCtx, endRead := context.WithCancel(ctx)
	defer endRead()
	blockErr := make(chan error, 1)
	go func() {
		_, err := s.Block(readCtx, 10, block)
		blockErr <- err
	}()

	var line string
	require.Eventually(t, func() bool {
		line = blockedReader(t, admin)
		return line != ""
	}, 10*time.Second, 5*time.Millisecond, "the blocking read never reached the server")
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
	endRead()
	select {
	case err := <-blockErr:
		require.ErrorIs(t, err, context.Canceled, "Block on a frozen master: want it to give the read up when its context ends")
	case <-time.After(30 * time.Second): // a bound against a hang, not a measure
		t.Fatal("Block did not return while its read hung: a Subscriber's Close would wait for the read")
	}
	s.Interrupt() // the read still runs, on the frozen master

	// The read returns once the master answers it (its block time has
	// passed). Nothing is sent until the connection is closed.
	thaw()
	select {
	case <-readerNet.Closed():
	case <-time.After(30 * time.Second): // a bound against a hang, not a measure
		t.Fatalf("the reader's connection (%s) was not closed after its read returned", testserver.ClientField(line, "addr"))
	}

	// An interrupted server reads no more: neither on its connection nor
	// on a new one of the pool.
	before := dialed.Count(masterAddr)
	require.Equal(t, 1, before, "connections dialed to the master %s", masterAddr)
	for i := 1; i <= 2; i++ {
		es, err := s.Block(ctx, 10, 100*time.Millisecond)
		if err == nil || errors.Is(err, redis.Nil) {
			t.Fatalf("Block %d after Interrupt = %v, %v; want an error and no read", i, es, err)
		}
	}
	if got := dialed.Count(masterAddr); got != before {
		t.Fatalf("Block after Interrupt dialed %d connections, want none", got-before)
	}
}

// blockedReader returns the CLIENT LIST line of the client blocked in
// XREADGROUP on the server admin talks to, or "" while there is none.
func blockedReader(t *testing.T, admin *redis.Client) string {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "cmd=xreadgroup") && strings.Contains(line, "flags=b") {
			return line
		}
	}
	return ""
}
