package serverinfo

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// wantVerbs is the table of docs/server-verbs.md: which verbs each release
// has, by name and version.
func wantVerbs(name, version string) Verbs {
	var n [3]int
	for i, p := range strings.SplitN(version, ".", 3) {
		n[i], _ = strconv.Atoi(p)
	}
	at := func(major, minor, patch int) bool {
		return n[0] > major || n[0] == major && (n[1] > minor || n[1] == minor && n[2] >= patch)
	}
	if name == "valkey" {
		return Verbs{AckDel: at(9, 2, 0)}
	}
	return Verbs{
		ClaimInRead:   at(8, 4, 0),
		IdempotentAdd: at(8, 6, 0),
		AckedTrim:     at(8, 6, 0) || (n[0] == 8 && n[1] == 4 && n[2] >= 4) || (n[0] == 8 && n[1] == 2 && n[2] >= 7),
		AckDel:        at(8, 2, 0),
	}
}

func TestProbeFindsTheVerbsOfTheServer(t *testing.T) {
	srv := testserver.Start(t)
	for _, protocol := range []int{2, 3} {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: protocol})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, refused, err := Probe(ctx, client)
		cancel()
		_ = client.Close()
		if err != nil {
			t.Fatalf("RESP%d: Probe: %v", protocol, err)
		}
		want := wantVerbs(srv.Name(), srv.Version())
		if got != want {
			t.Errorf("RESP%d on %s %s: Probe = %+v (%s), want %+v", protocol, srv.Name(), srv.Version(), got, got, want)
		}
		// Redis 6.2 has no COMMAND DOCS: the baseline, with the refusal named.
		if strings.HasPrefix(srv.Version(), "6.") && srv.Name() == "redis" && !strings.Contains(refused, "COMMAND DOCS") {
			t.Errorf("RESP%d on Redis 6.2: refused = %q, want it to name COMMAND DOCS", protocol, refused)
		}
	}
}

func TestProbeOfARefusingUserIsTheBaselineAndNamesTheCommand(t *testing.T) {
	srv := testserver.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "nodocs", "on", ">pw", "~*", "+@all", "-command").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nodocs", Password: "pw"})
	defer client.Close()
	got, refused, err := Probe(ctx, client)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if got != (Verbs{}) || !strings.Contains(refused, "COMMAND DOCS") {
		t.Errorf("Probe = %+v, refused %q: want the baseline and COMMAND DOCS named", got, refused)
	}
}

func TestKnownProbesOnceAndAgainAfterForget(t *testing.T) {
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	ctx := context.Background()
	k := NewKnown(client, false)
	v, changed, _, err := k.Verbs(ctx)
	if err != nil || !changed {
		t.Fatalf("first Verbs: changed %v, err %v: want a first answer", changed, err)
	}
	if _, changed, _, _ := k.Verbs(ctx); changed {
		t.Error("second Verbs reports a change")
	}
	srv.Kill()
	k.Forget()
	if _, _, _, err := k.Verbs(ctx); err == nil {
		t.Error("Verbs after Forget with the server down: want the probe's error")
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	again, changed, _, err := k.Verbs(ctx)
	if err != nil || changed || again != v {
		t.Errorf("Verbs after restart = %+v changed %v err %v, want %+v unchanged", again, changed, err, v)
	}
	if b, _, _, _ := NewKnown(client, true).Verbs(ctx); b != (Verbs{}) {
		t.Errorf("a forced baseline answers %+v", b)
	}
}

func TestAckedTrimWorks(t *testing.T) {
	for version, want := range map[string]bool{
		"7.0.15": false, "8.0.6": false, "8.2.6": false, "8.2.7": true, "8.4.3": false,
		"8.4.4": true, "8.6.0": true, "9.0.1": true, "8.10.0": true,
	} {
		if got := ackedTrimWorks("# Server\r\nredis_version:" + version + "\r\n"); got != want {
			t.Errorf("ackedTrimWorks(%s) = %v, want %v", version, got, want)
		}
	}
}

// On a cluster every master is asked: the answer is what they all have,
// the same as one node of the same server gives.
func TestProbeOfAClusterAsksEveryMaster(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, _, err := Probe(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	node := c.Node(c.Addrs()[0])
	if want := wantVerbs(node.Name(), node.Version()); got != want {
		t.Errorf("cluster Probe = %+v, want %+v", got, want)
	}
	var asked atomic.Int32
	err = client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		stats, err := m.Info(ctx, "commandstats").Result()
		if err == nil && strings.Contains(stats, "cmdstat_command|docs:calls=") {
			asked.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Redis 6.2 has no COMMAND DOCS, and counts any COMMAND call as one.
	noDocs := node.Name() == "redis" && strings.HasPrefix(node.Version(), "6.")
	if asked := asked.Load(); asked != 3 && !noDocs {
		t.Errorf("COMMAND DOCS reached %d masters, want every one (3)", asked)
	}
	if NewKnown(client, false).NeedsProbe() {
		t.Error("NeedsProbe of a cluster client: want false (one node cannot answer for all)")
	}
}

// What an older node answers to a newer verb is a refused verb; other
// replies and network errors are not.
func TestRefusedVerb(t *testing.T) {
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	ctx := context.Background()
	if err := client.Set(ctx, "str", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []any
		want bool
	}{
		// What Redis 7.0 answers to Redis 8's XADD ... IDMP, XREADGROUP
		// ... CLAIM and XACKDEL.
		{[]any{"XADD", "s", "NOSUCHOPTION", "x", "*", "f", "v"}, true},
		{[]any{"XREADGROUP", "GROUP", "g", "c", "NOSUCHOPTION", "100", "STREAMS", "s", ">"}, true},
		{[]any{"XNOSUCHCOMMAND", "s"}, true},
		{[]any{"XADD", "str", "*", "f", "v"}, false}, // WRONGTYPE
		{[]any{"XACK", "s", "nogroup", "1-1"}, false},
	} {
		err := client.Do(ctx, tc.args...).Err()
		if got := RefusedVerb(err); got != tc.want {
			t.Errorf("%v: RefusedVerb(%v) = %v, want %v", tc.args, err, got, tc.want)
		}
	}
	if RefusedVerb(io.EOF) || RefusedVerb(nil) {
		t.Error("a network error or none is no refused verb")
	}
}
