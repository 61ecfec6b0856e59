package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// binary is the command built once for the tests, by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "valkeystream-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "valkeystream")
	build := exec.Command("go", "build", "-o", binary, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the command: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

// cli runs the built command against addr with stdin as its input.
func cli(t *testing.T, addr, stdin string, args ...string) result {
	t.Helper()
	return cliEnv(t, addr, nil, stdin, args...)
}

// cliEnv is cli with the environment variables env ("NAME=value") added.
func cliEnv(t *testing.T, addr string, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), "VALKEYSTREAM_ADDR="+addr, "VALKEYSTREAM_URL=", "VALKEYSTREAM_KEY_PREFIX=")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running %v: %v", args, err)
	}
	return r
}

// ok runs the command and fails the test unless it exits 0.
func ok(t *testing.T, addr string, args ...string) string {
	t.Helper()
	r := cli(t, addr, "", args...)
	if r.code != 0 {
		t.Fatalf("valkeystream %s: exit %d, want 0; stderr: %s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// anHourLess matches how a table shows an hour less the time since it was
// set (a TTL of an hour, a message due in an hour): "1h0m0s" within half a
// second, then "59m59s", "59m58s", ... on a loaded machine.
var anHourLess = regexp.MustCompile(`\b(1h0m0s|59m[0-5]?[0-9]s)\b`)

// inAnHourLess matches how a table shows a message due in an hour.
var inAnHourLess = regexp.MustCompile(`in ` + anHourLess.String())

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decoding JSON output: %v\n%s", err, s)
	}
	return v
}

func newClient(t *testing.T, srv *testserver.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// add appends a message as DefaultMarshaler writes it and returns its id.
func add(t *testing.T, c redis.Cmdable, stream, uuid, payload string, md map[string]string) string {
	t.Helper()
	msg := message.NewMessage(uuid, message.Payload(payload))
	for k, v := range md {
		msg.Metadata[k] = v
	}
	fields, err := valkeystream.DefaultMarshaler{}.Marshal("", msg)
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: fields}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// columns returns the cells of each line of a table.
func columns(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

// checkAligned fails unless every row of the table starts its second column
// at the same offset as the header.
func checkAligned(t *testing.T, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	col := strings.Index(lines[0], "  ")
	for col < len(lines[0]) && lines[0][col] == ' ' {
		col++
	}
	for _, l := range lines[1:] {
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Fatalf("table not aligned at column %d:\n%s", col, out)
		}
	}
}

func TestUsageAndExitCodes(t *testing.T) {
	t.Parallel() // no server: the command alone
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string // in stdout or stderr
	}{
		{"help", []string{"help"}, 0, "dead replay"},
		{"no command", nil, 2, "Commands:"},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"command help", []string{"pending", "--help"}, 0, "-min-idle"},
		{"help for a command", []string{"help", "prune"}, 0, "XGROUP DELCONSUMER"},
		{"missing argument", []string{"pending", "orders"}, 2, "missing arguments: want <topic-or-stream> <group>"},
		{"too many arguments", []string{"entry", "a", "1-0", "extra"}, 2, "too many arguments"},
		{"unknown flag", []string{"streams", "--colour"}, 2, "flag provided but not defined: -colour"},
		{"replay says which", []string{"dead", "replay", "orders.dead"}, 2, "--all, --id, or a filter"},
		{"prune needs idle", []string{"prune", "s", "g"}, 2, "--idle is required"},
		{"help lists the delayed and dedup commands", []string{"help"}, 0, "delayed cancel"},
		{"help explains the prefix", []string{"help"}, 0, "VALKEYSTREAM_KEY_PREFIX"},
		{"dedup clear help", []string{"dedup", "clear", "--help"}, 0, "-in-progress"},
		{"delayed cancel says which", []string{"delayed", "cancel", "orders"}, 2, "their UUIDs, or --all"},
		{"address and URL", []string{"streams", "--addr", "127.0.0.1:1", "--url", "redis://127.0.0.1:1"}, 2, "give one"},
		{"unreachable server", []string{"streams", "--addr", "127.0.0.1:1", "--timeout", "2s"}, 1, "cannot reach the server at 127.0.0.1:1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := cli(t, "127.0.0.1:1", "", tc.args...)
			if r.code != tc.wantCode {
				t.Errorf("exit code %d, want %d; stderr: %s", r.code, tc.wantCode, r.stderr)
			}
			if !strings.Contains(r.stdout+r.stderr, tc.want) {
				t.Errorf("output does not contain %q:\nstdout: %s\nstderr: %s", tc.want, r.stdout, r.stderr)
			}
		})
	}
}

func TestStreams(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ctx := context.Background()
	first := add(t, c, "app:orders", "u1", "one", nil)
	add(t, c, "app:orders", "u2", "two", nil)
	last := add(t, c, "app:orders", "u3", "three", nil)
	for _, g := range []string{"billing", "audit"} {
		if err := c.XGroupCreate(ctx, "app:orders", g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.XGroupCreateMkStream(ctx, "app:empty", "g", "$").Err(); err != nil {
		t.Fatal(err)
	}
	add(t, c, "other:stream", "u4", "x", nil)
	c.Set(ctx, "app:not-a-stream", "v", 0)

	out := ok(t, srv.Addr(), "streams", "--prefix", "app:")
	rows := columns(out)
	if len(rows) != 3 {
		t.Fatalf("got %d lines, want a header and 2 streams:\n%s", len(rows), out)
	}
	checkAligned(t, out)
	if got := rows[2]; got[0] != "app:orders" || got[1] != "orders" || got[2] != "3" || got[len(got)-1] != "audit,billing" {
		t.Errorf("row %q, want app:orders (topic orders) with length 3 and groups audit,billing", got)
	}
	if got := rows[1]; got[0] != "app:empty" || got[1] != "empty" || got[2] != "0" || got[3] != "-" {
		t.Errorf("row %q, want app:empty (topic empty) with length 0 and no entry times", got)
	}

	infos := decode[[]streamInfo](t, ok(t, srv.Addr(), "streams", "--prefix", "app:", "--json"))
	if len(infos) != 2 {
		t.Fatalf("got %d streams, want 2: %+v", len(infos), infos)
	}
	o := infos[1]
	if o.Stream != "app:orders" || o.Topic != "orders" || o.Length != 3 || o.FirstID != first || o.LastID != last || len(o.Groups) != 2 {
		t.Errorf("got %+v, want app:orders, length 3, first %s, last %s, 2 groups", o, first, last)
	}
	if o.FirstTime != timeText(idTime(first)) {
		t.Errorf("first_time %q, want %q", o.FirstTime, timeText(idTime(first)))
	}

	r := cli(t, srv.Addr(), "", "streams", "--prefix", "none:")
	if r.code != 0 || !strings.Contains(r.stderr, "no streams found") {
		t.Errorf("empty prefix: exit %d, stderr %q; want 0 and a note", r.code, r.stderr)
	}
}

// pendingFixture makes stream s with 5 entries and group g: c1 has read 3
// (the first claimed once more, so delivered twice), c2 has read 1, and one
// entry is unread.
func pendingFixture(t *testing.T, c redis.Cmdable) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		ids = append(ids, add(t, c, "s", fmt.Sprintf("uuid-%d", i), "p", nil))
	}
	if err := c.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	read := func(consumer string, n int64) {
		if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: consumer, Streams: []string{"s", ">"}, Count: n, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read("c1", 3)
	read("c2", 1)
	if err := c.XClaim(ctx, &redis.XClaimArgs{Stream: "s", Group: "g", Consumer: "c1", Messages: []string{ids[0]}}).Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestGroup(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	pendingFixture(t, c)

	// Redis 6.2's XINFO GROUPS has no lag: the command shows "-" there.
	wantLag := "1"
	if info := c.Info(context.Background(), "server").Val(); strings.Contains(info, "redis_version:6.") {
		wantLag = "-"
	}
	out := ok(t, srv.Addr(), "group", "s")
	rows := columns(out)
	if len(rows) != 2 || rows[1][0] != "g" || rows[1][1] != "2" || rows[1][2] != "4" || rows[1][3] != wantLag {
		t.Errorf("group list:\n%s\nwant g with 2 consumers, 4 pending, lag %s", out, wantLag)
	}

	gi := decode[groupInfo](t, ok(t, srv.Addr(), "group", "s", "g", "--json"))
	if gi.Pending != 4 || lagText(gi.Lag) != wantLag || gi.Consumers != 2 {
		t.Errorf("got pending %d, lag %v, consumers %d; want 4, %s, 2", gi.Pending, lagText(gi.Lag), gi.Consumers, wantLag)
	}
	got := map[string]int64{}
	for _, ci := range gi.ConsumerList {
		got[ci.Name] = ci.Pending
	}
	if got["c1"] != 3 || got["c2"] != 1 || len(got) != 2 {
		t.Errorf("consumers' pending %v, want c1:3 c2:1", got)
	}
	if gi.OldestPendingID == "" {
		t.Error("no oldest pending id")
	}

	out = ok(t, srv.Addr(), "group", "s", "g")
	if !strings.Contains(out, "CONSUMER") || !strings.Contains(out, "c1") || !strings.Contains(out, "OLDEST PENDING") {
		t.Errorf("group table lacks the consumers or the oldest pending entry:\n%s", out)
	}

	r := cli(t, srv.Addr(), "", "group", "s", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, `stream "s" has no group "nope"`) {
		t.Errorf("unknown group: exit %d, stderr %q", r.code, r.stderr)
	}
	r = cli(t, srv.Addr(), "", "group", "missing")
	if r.code != 1 || !strings.Contains(r.stderr, `stream "missing" does not exist`) {
		t.Errorf("missing stream: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestPending(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ids := pendingFixture(t, c)

	all := decode[[]pendingEntry](t, ok(t, srv.Addr(), "pending", "s", "g", "--json"))
	if len(all) != 4 {
		t.Fatalf("got %d pending entries, want 4: %+v", len(all), all)
	}
	want := []struct {
		id, consumer, uuid string
		count              int64
	}{{ids[0], "c1", "uuid-0", 2}, {ids[1], "c1", "uuid-1", 1}, {ids[2], "c1", "uuid-2", 1}, {ids[3], "c2", "uuid-3", 1}}
	for i, w := range want {
		g := all[i]
		if g.ID != w.id || g.Consumer != w.consumer || g.UUID != w.uuid || g.Deliveries != w.count {
			t.Errorf("entry %d: got %+v, want id %s consumer %s uuid %s deliveries %d", i, g, w.id, w.consumer, w.uuid, w.count)
		}
	}

	filters := []struct {
		name string
		args []string
		want []string
	}{
		{"consumer", []string{"--consumer", "c2"}, []string{ids[3]}},
		{"min count", []string{"--min-count", "2"}, []string{ids[0]}},
		{"min idle", []string{"--min-idle", "1h"}, nil},
		{"limit", []string{"--limit", "2"}, []string{ids[0], ids[1]}},
		{"flags after the arguments", []string{"--consumer", "c1", "--min-count", "1"}, ids[:3]},
	}
	for _, f := range filters {
		t.Run(f.name, func(t *testing.T) {
			args := append([]string{"pending", "s", "g", "--json"}, f.args...)
			got := decode[[]pendingEntry](t, ok(t, srv.Addr(), args...))
			var gotIDs []string
			for _, p := range got {
				gotIDs = append(gotIDs, p.ID)
			}
			if fmt.Sprint(gotIDs) != fmt.Sprint(f.want) {
				t.Errorf("got %v, want %v", gotIDs, f.want)
			}
		})
	}

	// An entry deleted while pending is shown as such.
	if err := c.XDel(context.Background(), "s", ids[1]).Err(); err != nil {
		t.Fatal(err)
	}
	out := ok(t, srv.Addr(), "pending", "s", "g")
	checkAligned(t, out)
	rows := columns(out)
	if len(rows) != 5 || rows[0][0] != "ID" || rows[2][0] != ids[1] || rows[2][len(rows[2])-1] != "(deleted)" {
		t.Errorf("table:\n%s\nwant 4 rows with %s shown (deleted)", out, ids[1])
	}
	if rows[1][len(rows[1])-2] != "2" || rows[1][len(rows[1])-1] != "uuid-0" {
		t.Errorf("first row %q, want 2 deliveries and uuid-0", rows[1])
	}
}

func TestEntry(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	id := add(t, c, "s", "the-uuid", "hello payload", map[string]string{"trace": "abc"})
	raw, err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: "s", Values: []any{"foo", "bar"}}).Result()
	if err != nil {
		t.Fatal(err)
	}

	v := decode[entryView](t, ok(t, srv.Addr(), "entry", "s", id, "--json"))
	if v.UUID != "the-uuid" || v.Payload != "hello payload" || v.Metadata["trace"] != "abc" || v.PayloadBytes != 13 {
		t.Errorf("got %+v, want the-uuid, hello payload, trace=abc", v)
	}
	if len(v.PendingIn) != 0 {
		t.Errorf("pending in %+v before any group read it, want none", v.PendingIn)
	}

	// Pending in one of two groups, delivered twice.
	ctx := context.Background()
	for _, g := range []string{"billing", "audit"} {
		if err := c.XGroupCreate(ctx, "s", g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "w1", Streams: []string{"s", ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XClaim(ctx, &redis.XClaimArgs{Stream: "s", Group: "billing", Consumer: "w2", Messages: []string{id}}).Err(); err != nil {
		t.Fatal(err)
	}
	v = decode[entryView](t, ok(t, srv.Addr(), "entry", "s", id, "--json"))
	if len(v.PendingIn) != 1 || v.PendingIn[0].Group != "billing" || v.PendingIn[0].Consumer != "w2" || v.PendingIn[0].Deliveries != 2 {
		t.Errorf("pending in %+v, want billing held by w2 after 2 deliveries", v.PendingIn)
	}
	out := ok(t, srv.Addr(), "entry", "s", id, "--payload-bytes", "5")
	for _, want := range []string{"the-uuid", "metadata trace", "hello... (13 bytes)", "pending in billing", "consumer w2", "2 deliveries"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	v = decode[entryView](t, ok(t, srv.Addr(), "entry", "s", raw, "--json"))
	if v.DecodeError == "" || v.Fields["foo"] != "bar" {
		t.Errorf("undecodable entry: got %+v, want a decode error and the raw field foo=bar", v)
	}

	r := cli(t, srv.Addr(), "", "entry", "s", "1-1")
	if r.code != 1 || !strings.Contains(r.stderr, "has no entry 1-1") {
		t.Errorf("missing entry: exit %d, stderr %q", r.code, r.stderr)
	}
	r = cli(t, srv.Addr(), "", "entry", "s", "nonsense")
	if r.code != 2 || !strings.Contains(r.stderr, "not a stream entry id") {
		t.Errorf("bad id: exit %d, stderr %q", r.code, r.stderr)
	}
}
