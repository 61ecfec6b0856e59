package testserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// ClusterNodeTimeout is the cluster-node-timeout of the nodes started by
	// StartCluster: a master that stops answering for this long is failed
	// over by its replica.
	ClusterNodeTimeout = 1000 * time.Millisecond

	// clusterReadyTimeout bounds how long StartCluster waits for the
	// cluster to form.
	clusterReadyTimeout = 60 * time.Second
)

// replicationArgs make a master start a full sync at once, instead of
// waiting (5 s by default) for more replicas to share a diskless transfer,
// and ping its replicas every second instead of every 10: a new replica
// whose replication offset is still 0 is left out of CLUSTER SLOTS.
var replicationArgs = []string{"--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"}

// Cluster is a Redis Cluster of private server processes: three masters
// that share the 16384 slots and one replica for each. Its methods are safe
// for concurrent use.
type Cluster struct {
	nodes []*Server // masters first, then their replicas in the same order
	ids   map[string]string
}

// serverBinary returns the binary for private processes, or skips t when
// none is installed (a Cluster or a Sentinel group cannot be made from an
// external server or a container).
func serverBinary(t testing.TB, what string) string {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	if bin == "" {
		t.Skipf("testserver: a %s needs a redis-server or valkey-server binary (%s may name it); none found on PATH", what, envServer)
	}
	return bin
}

// StartCluster starts six cluster-enabled server processes on free loopback
// ports (three masters, one replica each, cluster-node-timeout
// ClusterNodeTimeout), joins them with CLUSTER MEET, ADDSLOTS and
// REPLICATE, waits until every node reports cluster_state:ok and every
// replica is in sync, and registers their shutdown with t.Cleanup. It uses
// the same binary as Start; it skips the test when only an external server
// or Docker is available.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := serverBinary(t, "cluster")
	c := &Cluster{ids: make(map[string]string)}
	extra := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout / time.Millisecond)),
		// A replica that lost its master for a while may still take over.
		"--cluster-replica-validity-factor", "0",
	}
	extra = append(extra, replicationArgs...)
	for range 6 {
		s, err := startProcess(bin, t, procConfig{extra: extra})
		if err != nil {
			c.shutdown()
			t.Fatalf("testserver: cluster node: %v", err)
		}
		c.nodes = append(c.nodes, s)
	}
	t.Cleanup(c.shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	if err := c.create(ctx); err != nil {
		t.Fatalf("testserver: create cluster: %v", err)
	}
	t.Logf("testserver: started cluster of %s %s at %s", c.nodes[0].name, c.nodes[0].version, strings.Join(c.Addrs(), " "))
	return c
}

func (c *Cluster) shutdown() {
	for _, n := range c.nodes {
		n.shutdown()
	}
}

// Addrs returns the addresses of every node, masters first, as first
// started (roles change with failovers).
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

// Node returns the node at addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.nodes {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

func (c *Cluster) create(ctx context.Context) error {
	for _, n := range c.nodes {
		id, err := do(ctx, n.addr, "CLUSTER", "MYID")
		if err != nil {
			return err
		}
		c.ids[n.addr] = fmt.Sprint(id)
	}
	first := c.nodes[0]
	for _, n := range c.nodes[1:] {
		if _, err := do(ctx, first.addr, "CLUSTER", "MEET", "127.0.0.1", n.port); err != nil {
			return err
		}
	}
	ranges := [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, r := range ranges {
		// CLUSTER ADDSLOTS with every slot, not ADDSLOTSRANGE, which
		// Redis 6.2 does not have.
		args := []any{"CLUSTER", "ADDSLOTS"}
		for slot := r[0]; slot <= r[1]; slot++ {
			args = append(args, slot)
		}
		if _, err := do(ctx, c.nodes[i].addr, args...); err != nil {
			return err
		}
	}
	// A replica accepts REPLICATE once it has heard of its master through
	// the gossip that MEET started.
	for i, r := range c.nodes[3:] {
		master := c.ids[c.nodes[i].addr]
		err := poll(ctx, func() error {
			_, err := do(ctx, r.addr, "CLUSTER", "REPLICATE", master)
			return err
		})
		if err != nil {
			return fmt.Errorf("%s replicating %s: %w", r.addr, c.nodes[i].addr, err)
		}
	}
	for _, n := range c.nodes {
		err := poll(ctx, func() error { return clusterNodeReady(ctx, n.addr, len(c.nodes)) })
		if err != nil {
			return fmt.Errorf("node %s not ready: %w", n.addr, err)
		}
	}
	return nil
}

// clusterNodeReady reports nil once the node at addr says the cluster is
// ok, knows every node, and, if it is a replica, is in sync with its
// master.
func clusterNodeReady(ctx context.Context, addr string, nodes int) error {
	info, err := doString(ctx, addr, "CLUSTER", "INFO")
	if err != nil {
		return err
	}
	f := infoFields(info)
	if f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(nodes) {
		return fmt.Errorf("cluster_state %s, %s known nodes", f["cluster_state"], f["cluster_known_nodes"])
	}
	repl, err := doString(ctx, addr, "INFO", "replication")
	if err != nil {
		return err
	}
	f = infoFields(repl)
	if f["role"] == "slave" && f["master_link_status"] != "up" {
		return fmt.Errorf("replica link %s", f["master_link_status"])
	}
	if f["role"] == "master" && f["connected_slaves"] != "1" {
		return fmt.Errorf("master with %s replicas", f["connected_slaves"])
	}
	cl := newClient(addr)
	defer cl.Close()
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return err
	}
	if len(slots) != 3 {
		return fmt.Errorf("%d slot ranges, want 3", len(slots))
	}
	for _, r := range slots {
		if len(r.Nodes) != 2 {
			return fmt.Errorf("slots %d-%d served by %d nodes, want a master and a replica", r.Start, r.End, len(r.Nodes))
		}
	}
	return nil
}

// SlotOwner returns the address of the master that serves key's slot, and
// of its replicas, as the first node that answers sees them.
func (c *Cluster) SlotOwner(ctx context.Context, key string) (master string, replicas []string, err error) {
	var lastErr error
	for _, n := range c.nodes {
		if !n.alive() {
			continue
		}
		cl := newClient(n.addr)
		s, err := cl.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			_ = cl.Close()
			lastErr = err
			continue
		}
		slots, err := cl.ClusterSlots(ctx).Result()
		_ = cl.Close()
		if err != nil {
			lastErr = err
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= s && s <= int64(r.End) && len(r.Nodes) > 0 {
				for _, rn := range r.Nodes[1:] {
					replicas = append(replicas, rn.Addr)
				}
				return r.Nodes[0].Addr, replicas, nil
			}
		}
		lastErr = fmt.Errorf("slot %d of %q has no master", s, key)
	}
	if lastErr == nil {
		lastErr = errors.New("no node is running")
	}
	return "", nil, lastErr
}

// WaitMaster waits until the node at addr reports itself a master, the
// cluster is ok in its view, and every running node names it in CLUSTER
// SLOTS: the end of a failover, as the cluster itself sees it.
func (c *Cluster) WaitMaster(ctx context.Context, addr string) error {
	return poll(ctx, func() error {
		repl, err := doString(ctx, addr, "INFO", "replication")
		if err != nil {
			return err
		}
		if role := infoFields(repl)["role"]; role != "master" {
			return fmt.Errorf("role %s", role)
		}
		info, err := doString(ctx, addr, "CLUSTER", "INFO")
		if err != nil {
			return err
		}
		if st := infoFields(info)["cluster_state"]; st != "ok" {
			return fmt.Errorf("cluster_state %s", st)
		}
		for _, n := range c.nodes {
			if n.alive() {
				if err := servesSlots(ctx, n.addr, addr); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// servesSlots reports nil when the node at addr names master as the master
// of a slot range.
func servesSlots(ctx context.Context, addr, master string) error {
	cl := newClient(addr)
	defer cl.Close()
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return err
	}
	for _, r := range slots {
		if len(r.Nodes) > 0 && r.Nodes[0].Addr == master {
			return nil
		}
	}
	return fmt.Errorf("%s does not name %s as a master yet", addr, master)
}

// Failover makes the replica at addr take over from its master with
// CLUSTER FAILOVER (a planned failover: the master stops writes until the
// replica has caught up), and waits until it reports itself master.
func (c *Cluster) Failover(ctx context.Context, addr string) error {
	if _, err := do(ctx, addr, "CLUSTER", "FAILOVER"); err != nil {
		return fmt.Errorf("CLUSTER FAILOVER on %s: %w", addr, err)
	}
	return c.WaitMaster(ctx, addr)
}

// alive reports whether the private process is wanted up.
func (s *Server) alive() bool { return s.proc.alive() }

// do runs one command on addr with a client that does not retry.
func do(ctx context.Context, addr string, args ...any) (any, error) {
	cl := newClient(addr)
	defer cl.Close()
	v, err := cl.Do(ctx, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", commandName(args), addr, err)
	}
	return v, nil
}

// commandName is the first two words of a command, for error messages.
func commandName(args []any) string {
	words := make([]string, 0, 2)
	for _, a := range args[:min(2, len(args))] {
		words = append(words, fmt.Sprint(a))
	}
	return strings.Join(words, " ")
}

func doString(ctx context.Context, addr string, args ...any) (string, error) {
	v, err := do(ctx, addr, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s on %s: reply %T, want a string", commandName(args), addr, v)
	}
	return s, nil
}

// infoFields parses INFO-style "key:value" lines.
func infoFields(info string) map[string]string {
	fields := make(map[string]string)
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields
}

// poll calls f every 20 ms until it returns nil or ctx ends.
func poll(ctx context.Context, f func() error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}
