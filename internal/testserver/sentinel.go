package testserver

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// SentinelMasterName is the name under which the sentinels started by
	// StartSentinel monitor their master.
	SentinelMasterName = "valkeystream"

	// SentinelDownAfter is the sentinels' down-after-milliseconds: a master
	// that does not answer for this long is failed over.
	SentinelDownAfter = 1000 * time.Millisecond

	// sentinelFailoverTimeout is the sentinels' failover-timeout.
	sentinelFailoverTimeout = 3000 * time.Millisecond
)

// Sentinel is a Sentinel group of private server processes: a master, one
// replica and three sentinels (quorum 2). Its methods are safe for
// concurrent use.
type Sentinel struct {
	data      []*Server // the master and the replica, as first started
	sentinels []*Server
}

// StartSentinel starts a master, a replica of it and three sentinels that
// monitor it as SentinelMasterName (down-after-milliseconds
// SentinelDownAfter), each on a free loopback port from the same binary as
// Start (run with --sentinel), waits until every sentinel knows the replica
// and the other sentinels, and registers their shutdown with t.Cleanup. It
// skips the test when only an external server or Docker is available.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin := serverBinary(t, "Sentinel group")
	g := &Sentinel{}
	t.Cleanup(g.shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()

	master, err := startProcess(bin, t, procConfig{extra: replicationArgs})
	if err != nil {
		t.Fatalf("testserver: sentinel master: %v", err)
	}
	g.data = append(g.data, master)
	replica, err := startProcess(bin, t, procConfig{extra: append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.port)}, replicationArgs...)})
	if err != nil {
		t.Fatalf("testserver: sentinel replica: %v", err)
	}
	g.data = append(g.data, replica)
	// The sentinels learn of the replica from the master's INFO: start
	// them once the replica is attached.
	if err := poll(ctx, func() error { return replicaInSync(ctx, replica.addr) }); err != nil {
		t.Fatalf("testserver: sentinel replica %s: %v", replica.addr, err)
	}

	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s %[4]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		SentinelMasterName, master.port, SentinelDownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
	for range 3 {
		s, err := startProcess(bin, t, procConfig{sentinel: conf})
		if err != nil {
			t.Fatalf("testserver: sentinel: %v", err)
		}
		g.sentinels = append(g.sentinels, s)
	}
	for _, s := range g.sentinels {
		if err := poll(ctx, func() error { return sentinelReady(ctx, s.addr) }); err != nil {
			t.Fatalf("testserver: sentinel %s not ready: %v", s.addr, err)
		}
	}
	t.Logf("testserver: started Sentinel group of %s %s: master %s, replica %s, sentinels %s",
		master.name, master.version, master.addr, replica.addr, strings.Join(g.SentinelAddrs(), " "))
	return g
}

func (g *Sentinel) shutdown() {
	for _, s := range g.sentinels {
		s.shutdown()
	}
	for _, s := range g.data {
		s.shutdown()
	}
}

// SentinelAddrs returns the sentinels' addresses.
func (g *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		addrs[i] = s.addr
	}
	return addrs
}

// DataAddrs returns the addresses of the master and the replica, as first
// started (roles change with failovers).
func (g *Sentinel) DataAddrs() []string {
	return []string{g.data[0].addr, g.data[1].addr}
}

// Node returns the data node (master or replica) at addr, or nil.
func (g *Sentinel) Node(addr string) *Server {
	for _, s := range g.data {
		if s.addr == addr {
			return s
		}
	}
	return nil
}

// Master returns the master's address as the first sentinel that answers
// names it.
func (g *Sentinel) Master(ctx context.Context) (string, error) {
	var lastErr error
	for _, s := range g.sentinels {
		v, err := do(ctx, s.addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterName)
		if err != nil {
			lastErr = err
			continue
		}
		if hp, ok := v.([]any); ok && len(hp) == 2 {
			return fmt.Sprintf("%v:%v", hp[0], hp[1]), nil
		}
		lastErr = fmt.Errorf("sentinel %s: master address %v", s.addr, v)
	}
	return "", lastErr
}

// WaitMaster waits until every sentinel names addr as the master and the
// node at addr reports itself master: the end of a failover, as the
// sentinels see it.
func (g *Sentinel) WaitMaster(ctx context.Context, addr string) error {
	return poll(ctx, func() error {
		for _, s := range g.sentinels {
			v, err := do(ctx, s.addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterName)
			if err != nil {
				return err
			}
			if hp, ok := v.([]any); !ok || len(hp) != 2 || fmt.Sprintf("%v:%v", hp[0], hp[1]) != addr {
				return fmt.Errorf("sentinel %s names master %v", s.addr, v)
			}
		}
		repl, err := doString(ctx, addr, "INFO", "replication")
		if err != nil {
			return err
		}
		if role := infoFields(repl)["role"]; role != "master" {
			return fmt.Errorf("%s has role %s", addr, role)
		}
		return nil
	})
}

// Failover asks a sentinel for a planned failover (SENTINEL FAILOVER) and
// returns the address of the master it replaces; WaitMaster waits for the
// new one.
func (g *Sentinel) Failover(ctx context.Context) (old string, err error) {
	old, err = g.Master(ctx)
	if err != nil {
		return "", err
	}
	if _, err := do(ctx, g.sentinels[0].addr, "SENTINEL", "FAILOVER", SentinelMasterName); err != nil {
		return "", err
	}
	return old, nil
}

// WaitReplicaInSync waits until the node at addr is a replica whose link to
// its master is up.
func (g *Sentinel) WaitReplicaInSync(ctx context.Context, addr string) error {
	return poll(ctx, func() error { return replicaInSync(ctx, addr) })
}

func replicaInSync(ctx context.Context, addr string) error {
	repl, err := doString(ctx, addr, "INFO", "replication")
	if err != nil {
		return err
	}
	f := infoFields(repl)
	if f["role"] != "slave" || f["master_link_status"] != "up" {
		return fmt.Errorf("role %s, master link %s", f["role"], f["master_link_status"])
	}
	return nil
}

// sentinelReady reports nil once the sentinel at addr knows one replica and
// two other sentinels of the master.
func sentinelReady(ctx context.Context, addr string) error {
	v, err := do(ctx, addr, "SENTINEL", "REPLICAS", SentinelMasterName)
	if err != nil {
		return err
	}
	if r, _ := v.([]any); len(r) != 1 {
		return fmt.Errorf("knows %d replicas, want 1", len(r))
	}
	v, err = do(ctx, addr, "SENTINEL", "SENTINELS", SentinelMasterName)
	if err != nil {
		return err
	}
	if s, _ := v.([]any); len(s) != 2 {
		return fmt.Errorf("knows %d other sentinels, want 2", len(s))
	}
	return nil
}
