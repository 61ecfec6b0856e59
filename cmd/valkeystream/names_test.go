package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestStreamNames(t *testing.T) {
	for _, tc := range []struct {
		prefix, name, topic, key string
	}{
		{"", "orders", "orders", "orders"},
		{"", "shop:orders", "shop:orders", "shop:orders"},
		{"shop:", "orders.placed", "orders.placed", "shop:orders.placed"},
		{"shop:", "shop:orders.placed", "orders.placed", "shop:orders.placed"},
		{"shop:", "shop:shop:x", "shop:x", "shop:shop:x"}, // a topic that begins with the prefix, as its key
		{"shop:", "{orders}", "{orders}", "shop:{orders}"},
	} {
		e := &env{prefix: tc.prefix}
		if got := e.stream(tc.name); got.Topic != tc.topic || got.Key != tc.key {
			t.Errorf("prefix %q, name %q: got topic %q key %q, want topic %q key %q", tc.prefix, tc.name, got.Topic, got.Key, tc.topic, tc.key)
		}
	}
}

// prefixFixture makes the stream of topic orders.placed under the prefix
// shop:, with group billing: c1 holds 2 entries, idle holds none, and one
// entry is unread. It returns the entry ids.
func prefixFixture(t *testing.T, c redis.Cmdable) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for _, u := range []string{"u-0", "u-1", "u-2"} {
		ids = append(ids, add(t, c, "shop:orders.placed", u, "p", nil))
	}
	if err := c.XGroupCreate(ctx, "shop:orders.placed", "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "c1", Streams: []string{"shop:orders.placed", ">"}, Count: 2, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XGroupCreateConsumer(ctx, "shop:orders.placed", "billing", "idle").Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Every command that takes a stream takes its topic, with the prefix given
// by the flag or the environment, or its key.
func TestCommandsTakeTopics(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ids := prefixFixture(t, c)
	addr := srv.Addr()
	viaEnv := []string{"VALKEYSTREAM_KEY_PREFIX=shop:"}

	// Three ways to name it: topic with --prefix, topic with the
	// environment, key with either.
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"topic, flag", nil, []string{"orders.placed", "--prefix", "shop:"}},
		{"topic, environment", viaEnv, []string{"orders.placed"}},
		{"key, flag", nil, []string{"shop:orders.placed", "--prefix", "shop:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(args ...string) result {
				t.Helper()
				line := []string{args[0], tc.args[0]} // the command, the stream
				line = append(line, args[1:]...)
				line = append(line, tc.args[1:]...)
				r := cliEnv(t, addr, tc.env, "", line...)
				if r.code != 0 {
					t.Fatalf("valkeystream %v: exit %d, stderr %s", args, r.code, r.stderr)
				}
				return r
			}
			gi := decode[groupInfo](t, run("group", "billing", "--json").stdout)
			if gi.Stream != "shop:orders.placed" || gi.Topic != "orders.placed" || gi.Pending != 2 {
				t.Errorf("group: got stream %q topic %q pending %d, want shop:orders.placed, orders.placed, 2", gi.Stream, gi.Topic, gi.Pending)
			}
			r := run("group", "billing")
			if rows := columns(r.stdout); len(rows) < 2 || rows[0][1] != "TOPIC" || rows[1][0] != "shop:orders.placed" || rows[1][1] != "orders.placed" {
				t.Errorf("group table does not show key and topic:\n%s", r.stdout)
			}
			if want := `stream "shop:orders.placed" (topic "orders.placed")`; !strings.Contains(r.stderr, want) {
				t.Errorf("stderr %q lacks %q", r.stderr, want)
			}
			if got := decode[[]groupInfo](t, run("group", "--json").stdout); len(got) != 1 || got[0].Group != "billing" {
				t.Errorf("group list: got %+v, want billing", got)
			}
			pe := decode[[]pendingEntry](t, run("pending", "billing", "--json").stdout)
			if len(pe) != 2 || pe[0].ID != ids[0] || pe[0].UUID != "u-0" {
				t.Errorf("pending: got %+v, want 2 entries from %s (u-0)", pe, ids[0])
			}
			ev := decode[entryView](t, run("entry", ids[2], "--json").stdout)
			if ev.UUID != "u-2" || ev.Stream != "shop:orders.placed" || ev.Topic != "orders.placed" {
				t.Errorf("entry: got uuid %q stream %q topic %q, want u-2, shop:orders.placed, orders.placed", ev.UUID, ev.Stream, ev.Topic)
			}
			if out := run("entry", ids[2]).stdout; !strings.Contains(out, "topic") || !strings.Contains(out, "orders.placed") {
				t.Errorf("entry table lacks the topic:\n%s", out)
			}
			pr := decode[[]pruneResult](t, run("prune", "billing", "--idle", "1ms", "--dry-run", "--json").stdout)
			if len(pr) != 1 || pr[0].Consumer != "idle" || pr[0].Result != "would-remove" {
				t.Errorf("prune: got %+v, want idle would-remove", pr)
			}
		})
	}

	// streams filters by the prefix and shows each stream's topic.
	add(t, c, "other:x", "u", "p", nil)
	infos := decode[[]streamInfo](t, cliEnv(t, addr, viaEnv, "", "streams", "--json").stdout)
	if len(infos) != 1 || infos[0].Stream != "shop:orders.placed" || infos[0].Topic != "orders.placed" {
		t.Errorf("streams: got %+v, want shop:orders.placed only, topic orders.placed", infos)
	}

	// Without the prefix a topic is not found, and the error says why.
	r := cli(t, addr, "", "group", "orders.placed")
	if r.code != 1 || !strings.Contains(r.stderr, `stream "orders.placed" does not exist`) || !strings.Contains(r.stderr, "VALKEYSTREAM_KEY_PREFIX") {
		t.Errorf("topic without the prefix: exit %d, stderr %q; want 1 and advice to give the prefix", r.code, r.stderr)
	}
	// --prefix '' names keys outside the prefix of the environment.
	r = cliEnv(t, addr, viaEnv, "", "group", "other:x")
	if r.code != 1 || !strings.Contains(r.stderr, `"shop:other:x" (topic "other:x") does not exist`) {
		t.Errorf("key outside the prefix: exit %d, stderr %q; want it taken for a topic", r.code, r.stderr)
	}
	if r = cliEnv(t, addr, viaEnv, "", "group", "other:x", "--prefix", ""); r.code != 0 {
		t.Errorf("--prefix '': exit %d, stderr %q; want 0", r.code, r.stderr)
	}
	if r = cli(t, addr, "", "group", "x", "--prefix", "{shop}:"); r.code != 2 || !strings.Contains(r.stderr, "contains '{' or '}'") {
		t.Errorf("prefix with a hash tag: exit %d, stderr %q; want 2", r.code, r.stderr)
	}
}

// deadLetter adds a dead letter of stream from, as DeadLetter writes it, to
// the stream dead.
func addDeadLetter(t *testing.T, c redis.Cmdable, dead, from, uuid string) string {
	t.Helper()
	return add(t, c, dead, uuid, "p", map[string]string{
		valkeystream.MetadataError:          "card declined",
		valkeystream.MetadataOriginalStream: from,
		valkeystream.MetadataOriginalGroup:  "billing",
	})
}

// Dead-letter commands take the source topic, the dead-letter topic or
// the dead-letter stream's key.
func TestDeadCommandsTakeTopics(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	addr := srv.Addr()
	add(t, c, "shop:orders.placed", "live", "p", nil)
	addDeadLetter(t, c, "shop:orders.placed.dead", "shop:orders.placed", "d-1")
	addDeadLetter(t, c, "shop:orders.placed.dead", "shop:other", "d-2")
	addDeadLetter(t, c, "shop:failed-orders", "shop:orders.placed", "d-3") // a DeadLetterConfig.Topic of its own

	for _, tc := range []struct {
		name     string
		args     []string
		wantUUID []string
	}{
		{"source topic", []string{"orders.placed"}, []string{"d-1", "d-2"}},
		{"dead-letter topic", []string{"orders.placed.dead"}, []string{"d-1", "d-2"}},
		{"dead-letter key", []string{"shop:orders.placed.dead"}, []string{"d-1", "d-2"}},
		{"dead-letter topic of another name", []string{"failed-orders"}, []string{"d-3"}},
		{"origin filter by topic", []string{"orders.placed", "--origin-stream", "orders.placed"}, []string{"d-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cliEnv(t, addr, nil, "", append([]string{"dead", "list", "--prefix", "shop:", "--json"}, tc.args...)...)
			if r.code != 0 {
				t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
			}
			var got []string
			for _, d := range decode[[]deadLetter](t, r.stdout) {
				got = append(got, d.UUID)
			}
			if strings.Join(got, ",") != strings.Join(tc.wantUUID, ",") {
				t.Errorf("got %v, want %v", got, tc.wantUUID)
			}
			if !strings.Contains(r.stderr, "dead-letter stream") {
				t.Errorf("stderr %q does not say which dead-letter stream was read", r.stderr)
			}
		})
	}

	// A source topic without dead letters is not read as a dead-letter
	// stream.
	add(t, c, "shop:payments", "p-1", "p", nil)
	r := cli(t, addr, "", "dead", "list", "payments", "--prefix", "shop:")
	if r.code != 1 || !strings.Contains(r.stderr, "holds no dead letters") {
		t.Errorf("topic without dead letters: exit %d, stderr %q", r.code, r.stderr)
	}
	r = cli(t, addr, "", "dead", "list", "nothing", "--prefix", "shop:")
	if r.code != 1 || !strings.Contains(r.stderr, `neither "shop:nothing.dead" nor "shop:nothing" exists`) {
		t.Errorf("missing topic: exit %d, stderr %q", r.code, r.stderr)
	}

	// Replay by source topic puts the dead letter back into the stream key.
	r = cliEnv(t, addr, []string{"VALKEYSTREAM_KEY_PREFIX=shop:"}, "", "dead", "replay", "orders.placed", "--origin-stream", "orders.placed", "--yes", "--json")
	if r.code != 0 {
		t.Fatalf("replay: exit %d, stderr %s", r.code, r.stderr)
	}
	res := decode[[]replayResult](t, r.stdout)
	if len(res) != 1 || res[0].UUID != "d-1" || res[0].Stream != "shop:orders.placed" || res[0].Result != "appended" {
		t.Fatalf("replay: got %+v, want d-1 appended to shop:orders.placed", res)
	}
	if n := c.XLen(context.Background(), "shop:orders.placed").Val(); n != 2 {
		t.Errorf("shop:orders.placed holds %d entries after the replay, want 2", n)
	}
	if n := c.XLen(context.Background(), "shop:orders.placed.dead").Val(); n != 1 {
		t.Errorf("shop:orders.placed.dead holds %d entries after the replay, want 1", n)
	}
}
