package testserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestCluster starts a cluster, writes through a ClusterClient, kills the
// master of the key's slot and waits for its replica to take over.
func TestCluster(t *testing.T) {
	c := testserver.StartCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	master, replicas, err := c.SlotOwner(ctx, "k")
	noErr(t, err, "SlotOwner")
	if len(replicas) != 1 {
		t.Fatalf("slot of k served by %s with replicas %v, want one replica", master, replicas)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	noErr(t, cc.Set(ctx, "k", "v", 0).Err(), "SET k")
	noErr(t, cc.Wait(ctx, 1, 5000).Err(), "WAIT")

	killed := time.Now()
	noErr(t, c.Node(master).Kill(), "kill %s", master)
	noErr(t, c.WaitMaster(ctx, replicas[0]), "wait for %s to take over", replicas[0])
	t.Logf("replica %s took over %s after %s", replicas[0], master, time.Since(killed).Round(time.Millisecond))
	got, _, err := c.SlotOwner(ctx, "k")
	noErr(t, err, "SlotOwner after the failover")
	if got != replicas[0] {
		t.Fatalf("slot of k served by %s after the failover, want %s", got, replicas[0])
	}
	requireValue(t, replicas[0], "k", "v")
}

// TestSentinel starts a Sentinel group and fails it over on request.
func TestSentinel(t *testing.T) {
	g := testserver.StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := g.Master(ctx)
	noErr(t, err, "Master")
	addrs := g.DataAddrs()
	if first != addrs[0] {
		t.Fatalf("sentinels name master %s, want %s", first, addrs[0])
	}
	noErr(t, client(t, addrs[0]).Set(ctx, "k", "v", 0).Err(), "SET k")
	noErr(t, client(t, addrs[0]).Wait(ctx, 1, 5000).Err(), "WAIT")

	start := time.Now()
	old, err := g.Failover(ctx)
	noErr(t, err, "Failover")
	if old != addrs[0] {
		t.Fatalf("Failover replaced %s, want %s", old, addrs[0])
	}
	noErr(t, g.WaitMaster(ctx, addrs[1]), "planned failover to %s", addrs[1])
	t.Logf("planned failover from %s to %s took %s", old, addrs[1], time.Since(start).Round(time.Millisecond))
	requireValue(t, addrs[1], "k", "v")
}
