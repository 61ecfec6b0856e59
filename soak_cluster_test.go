package valkeystream_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestChaosSoakCluster is the chaos soak on a Redis Cluster (three
// masters, three replicas): the same services, each output in its input
// partition's slot (so that ExactlyOnce's step lies in one slot), and
// among the faults planned failovers (CLUSTER FAILOVER), a worker frozen
// across one, and network cuts of a worker from every node. A master
// SIGKILLed is not among them: its replica may miss the last writes it
// acknowledged, which nothing here promises to keep (docs/reliability.md,
// "Not promised"), and every check of the soak counts on them. Like
// TestChaosSoak it runs only with VALKEYSTREAM_SOAK=1 (or =cluster), about
// 90 s.
func TestChaosSoakCluster(t *testing.T) {
	soakWanted(t, "cluster")
	testserver.Parallel(t) // beside the other tests: their load is one more fault
	p := soakCI
	p.For = soakDuration(t, p.For)
	runSoak(t, p, newSoakCluster)
}

// soakCluster is a cluster whose every node each worker slot reaches
// through a proxy of its own (soakworker -dial), so that a cut isolates
// one worker from the whole cluster.
type soakCluster struct {
	c       *testserver.Cluster
	proxies [][]*testserver.Proxy // [slot][node], in the order of c.Addrs()
}

func newSoakCluster(t *testing.T, workers int) soakTopology {
	n := &soakCluster{c: testserver.StartCluster(t)}
	for range workers {
		var ps []*testserver.Proxy
		for _, addr := range n.c.Addrs() {
			ps = append(ps, testserver.NewProxy(t, addr))
		}
		n.proxies = append(n.proxies, ps)
	}
	return n
}

func (n *soakCluster) describe() string {
	s := n.c.Node(n.c.Addrs()[0])
	return fmt.Sprintf("%s %s (cluster of 3 masters, 3 replicas)", s.Name(), s.Version())
}

func (n *soakCluster) newClient(t *testing.T, timeout time.Duration) redis.UniversalClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: n.c.Addrs(), ReadTimeout: timeout, WriteTimeout: timeout})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (n *soakCluster) cliArgs() []string { return []string{"--addr", strings.Join(n.c.Addrs(), ",")} }

func (n *soakCluster) workerArgs(slot int) []string {
	var dial []string
	for i, addr := range n.c.Addrs() {
		dial = append(dial, addr+"="+n.proxies[slot][i].Addr())
	}
	return []string{"-cluster", "-addr", strings.Join(n.c.Addrs(), ","), "-dial", strings.Join(dial, ",")}
}

func (n *soakCluster) perSlotOutputs() bool { return true }

func (n *soakCluster) faults() []soakFault {
	faults := []soakFault{
		{plural: "cuts", weight: 3, play: func(s *soak) string {
			slot := s.pa.rng.IntN(len(n.proxies))
			return s.cut(slot, n.proxies[slot])
		}},
		{plural: "planned failovers", weight: 2, play: n.failover},
	}
	if crashCanFreeze {
		faults = append(faults, soakFault{plural: "freezes across a planned failover", weight: 1, play: func(s *soak) string {
			var failover string
			frozen := s.frozenAcross("a planned failover", func() { failover = n.failover(s) })
			return frozen + ": " + failover
		}})
	}
	return faults
}

// failover has the master of a partition's slot hand over to its replica
// (a planned failover).
func (n *soakCluster) failover(s *soak) string {
	streams := s.pa.layout.Streams()
	key := streams[s.pa.rng.IntN(len(streams))]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	master, replicas, err := n.c.SlotOwner(ctx, key)
	require.NoError(s.t, err, "the master of %s", key)
	require.NotEmpty(s.t, replicas, "the replicas of %s's master %s", key, master)
	from := time.Now()
	require.NoError(s.t, n.c.Failover(ctx, replicas[0]), "failing %s over to %s", master, replicas[0])
	return fmt.Sprintf("planned failover of %s (the master of %s) to %s, done after %s", master, key, replicas[0], time.Since(from).Round(time.Millisecond))
}
