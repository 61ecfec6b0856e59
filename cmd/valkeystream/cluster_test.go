package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// On a cluster every command works through any one node: streams lists the
// streams of every master, and the others follow their keys' slots.
func TestCluster(t *testing.T) {
	testserver.Parallel(t)
	cl := testserver.StartCluster(t)
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = c.Close() })

	ids := pendingFixture(t, c) // stream "s", group "g"
	owner, _, err := cl.SlotOwner(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	// The node the command is given is a master that does not hold "s".
	seed := ""
	for _, a := range cl.Addrs()[:3] {
		if a != owner {
			seed = a
			break
		}
	}
	if seed == "" {
		t.Fatalf("no master other than %s", owner)
	}

	var want []string
	onSeed := 0
	for i := range 9 {
		key := fmt.Sprintf("app:s%d", i)
		add(t, c, key, fmt.Sprintf("u%d", i), "p", nil)
		want = append(want, key)
		if master, _, err := cl.SlotOwner(ctx, key); err != nil {
			t.Fatal(err)
		} else if master == seed {
			onSeed++
		}
	}
	if onSeed == 0 || onSeed == len(want) {
		t.Fatalf("%d of %d streams are on %s; the test needs some there and some elsewhere", onSeed, len(want), seed)
	}
	names := func(infos []streamInfo) []string {
		var out []string
		for _, si := range infos {
			out = append(out, si.Stream)
		}
		return out
	}

	// Detected from the node, with --cluster, and with a list of nodes.
	for _, args := range [][]string{
		{"streams", "--prefix", "app:", "--json"},
		{"streams", "--prefix", "app:", "--json", "--cluster"},
		{"streams", "--prefix", "app:", "--json", "--addr", strings.Join(cl.Addrs()[:2], ",")},
	} {
		if got := names(decode[[]streamInfo](t, ok(t, seed, args...))); !slices.Equal(got, want) {
			t.Errorf("%v: got %v, want %v", args, got, want)
		}
	}
	// Without the cluster, only the node's own streams.
	if got := decode[[]streamInfo](t, ok(t, seed, "streams", "--prefix", "app:", "--json", "--cluster=false")); len(got) != onSeed {
		t.Errorf("--cluster=false: got %v, want the %d streams on %s", names(got), onSeed, seed)
	}
	r := cli(t, seed, "", "streams", "--cluster=false", "--addr", strings.Join(cl.Addrs()[:2], ","))
	if r.code != exitUsage || !strings.Contains(r.stderr, "--cluster=false") {
		t.Errorf("a list of nodes with --cluster=false: exit %d, stderr %q; want %d and advice", r.code, r.stderr, exitUsage)
	}

	// Redis 6.2's XINFO GROUPS has no lag: the command says "-" there.
	wantLag := "1"
	if strings.Contains(c.Info(context.Background(), "server").Val(), "redis_version:6.") {
		wantLag = "-"
	}
	gi := decode[groupInfo](t, ok(t, seed, "group", "s", "g", "--json"))
	if gi.Pending != 4 || lagText(gi.Lag) != wantLag || gi.Consumers != 2 {
		t.Errorf("group: got pending %d, lag %v, consumers %d; want 4, %s, 2", gi.Pending, lagText(gi.Lag), gi.Consumers, wantLag)
	}
	if got := decode[[]pendingEntry](t, ok(t, seed, "pending", "s", "g", "--json")); len(got) != 4 || got[0].ID != ids[0] {
		t.Errorf("pending: got %+v, want 4 entries from %s", got, ids[0])
	}
	if out := ok(t, seed, "entry", "s", ids[1]); !strings.Contains(out, "uuid-1") {
		t.Errorf("entry: got\n%s\nwant uuid-1", out)
	}

	// Dead letters of a stream in one slot, replayed to another.
	deadLetters(t, c, "orders", 2)
	before := len(streamUUIDs(t, c, "orders"))
	replayed := decode[[]replayResult](t, ok(t, seed, "dead", "replay", "orders.dead", "--all", "--yes", "--json"))
	if len(replayed) != 2 || replayed[0].Result != "appended" {
		t.Errorf("dead replay: got %+v, want 2 appended", replayed)
	}
	if got := len(streamUUIDs(t, c, "orders")); got != before+2 {
		t.Errorf("orders holds %d entries after the replay, want %d", got, before+2)
	}
}
