package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// reply is a server error reply, as go-redis returns it.
type reply string

func (r reply) Error() string { return string(r) }
func (r reply) RedisError()   {}

func TestFailoverSymptom(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"redis.Nil", redis.Nil, false},
		{"connection refused", refused, true},
		{"wrapped connection refused", fmt.Errorf("xadd: %w", refused), true},
		{"dial timeout wrapping a deadline", &net.OpError{Op: "dial", Err: context.DeadlineExceeded}, true},
		{"connection closed", io.EOF, true},
		{"cut reply", io.ErrUnexpectedEOF, true},
		{"CLUSTERDOWN", reply("CLUSTERDOWN The cluster is down"), true},
		{"TRYAGAIN", reply("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"READONLY", reply("READONLY You can't write against a read only replica."), true},
		{"LOADING", reply("LOADING Redis is loading the dataset in memory"), true},
		{"MASTERDOWN", reply("MASTERDOWN Link with MASTER is down"), true},
		{"WRONGTYPE", reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"NOGROUP", reply("NOGROUP No such key or consumer group"), false},
		{"cancelled", context.Canceled, false},
		{"deadline", context.DeadlineExceeded, false},
		{"other", errors.New("encoding failed"), false},
	}
	for _, tc := range tests {
		if got := Symptom(tc.err); got != tc.want {
			t.Errorf("%s: Symptom(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestFailoverRetryDelay: the wait is capped only for clients that can fail
// over, and only for errors a failover causes.
func TestFailoverRetryDelay(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	sentinel := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() {
		_ = single.Close()
		_ = sentinel.Close()
		_ = cluster.Close()
	})
	const long = 4 * time.Second
	tests := []struct {
		name   string
		client redis.UniversalClient
		err    error
		want   time.Duration
	}{
		{"single node, refused", single, refused, long},
		{"sentinel, refused", sentinel, refused, RetryMax},
		{"cluster, refused", cluster, refused, RetryMax},
		{"cluster, WRONGTYPE", cluster, reply("WRONGTYPE x"), long},
		{"cluster, short backoff", cluster, refused, 0},
	}
	for _, tc := range tests {
		var f Hints
		delay := long
		if tc.want == 0 {
			delay, tc.want = 100*time.Millisecond, 100*time.Millisecond
		}
		if got := f.RetryDelay(tc.client, tc.err, delay); got != tc.want {
			t.Errorf("%s: retryDelay(%s) = %s, want %s", tc.name, delay, got, tc.want)
		}
	}
}

// TestFailoverReloadsTheSlotMap kills the master of a key's slot: once the
// cluster has promoted the replica, a client left alone still sends to the
// dead master (it reloads its slot map only every
// ClusterStateReloadInterval, a minute by default), while one whose errors
// go through Hints.Failed finds the new master within a few tries.
func TestFailoverReloadsTheSlotMap(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "failover-reload"
	master, replicas, err := c.SlotOwner(ctx, key)
	if err != nil || len(replicas) != 1 {
		t.Fatalf("SlotOwner(%q) = %s, %v, %v; want a master and one replica", key, master, replicas, err)
	}
	newClient := func() *redis.ClusterClient {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
		t.Cleanup(func() { _ = cc.Close() })
		if err := cc.Set(ctx, key, "before", 0).Err(); err != nil {
			t.Fatalf("SET before the crash: %v", err)
		}
		return cc
	}
	helped, alone := newClient(), newClient()

	killed := time.Now()
	if err := c.Node(master).Kill(); err != nil {
		t.Fatalf("kill %s: %v", master, err)
	}
	if err := c.WaitMaster(ctx, replicas[0]); err != nil {
		t.Fatalf("replica %s did not take over: %v", replicas[0], err)
	}
	promoted := time.Since(killed)

	if err := alone.Set(ctx, key, "alone", 0).Err(); err == nil {
		t.Fatal("a cluster client without help found the new master at once: the client reloads by itself now, and this test shows nothing")
	}

	var f Hints
	start := time.Now()
	tries := 0
	for {
		tries++
		err := helped.Set(ctx, key, "after", 0).Err()
		if err == nil {
			break
		}
		if !f.Failed(helped, err) {
			t.Fatalf("failed(%v) = false, want true: a write to a dead master is a failover symptom", err)
		}
		if since := time.Since(killed) - promoted; since > 10*time.Second {
			t.Fatalf("still failing %s after the promotion (%d tries): %v", since, tries, err)
		}
		time.Sleep(50 * time.Millisecond) // the poll of a wait for the write to go through
	}
	t.Logf("promotion %s after the kill; the helped client wrote again on try %d, %s after its first try",
		promoted.Round(time.Millisecond), tries, time.Since(start).Round(time.Millisecond))
}
