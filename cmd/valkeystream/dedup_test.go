package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// handled runs the Deduplicator d on a message uuid delivered from group
// billing of stream shop:orders.placed, with handler h, and reports whether
// h ran.
func handled(t *testing.T, d *valkeystream.Deduplicator, uuid string, h func()) bool {
	t.Helper()
	msg := message.NewMessage(uuid, message.Payload("p"))
	msg.Metadata.Set(valkeystream.MetadataStream, "shop:orders.placed")
	msg.Metadata.Set(valkeystream.MetadataGroup, "billing")
	ran := false
	_, err := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		ran = true
		h()
		return nil, nil
	})(msg)
	if err != nil {
		t.Errorf("handling %s: %v", uuid, err) // not Fatal: some run in a goroutine of their own
	}
	return ran
}

func newDedup(t *testing.T, c redis.UniversalClient, namespace string) *valkeystream.Deduplicator {
	t.Helper()
	d, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: c, Namespace: namespace, RunningTTL: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDedupShow(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	addr := srv.Addr()
	ctx := context.Background()
	if err := c.XGroupCreateMkStream(ctx, "shop:orders.placed", "billing", "$").Err(); err != nil {
		t.Fatal(err)
	}
	handled(t, newDedup(t, c, ""), "u-1", func() {})
	handled(t, newDedup(t, c, "emails"), "u-1", func() {})
	handled(t, newDedup(t, c, ""), "u-2", func() {})

	marks := decode[[]mark](t, ok(t, addr, "dedup", "show", "u-1", "--prefix", "shop:", "--json"))
	if len(marks) != 2 {
		t.Fatalf("got %d marks, want the group's and the namespace's: %+v", len(marks), marks)
	}
	ns, g := marks[0], marks[1] // sorted by key
	if g.Key != "valkeystream:dedup:shop:orders.placed:billing:u-1" || g.Stream != "shop:orders.placed" || g.Topic != "orders.placed" || g.Group != "billing" ||
		g.State != "done" || g.TTLMS < 59*60*1000 || g.TTLMS > 60*60*1000 {
		t.Errorf("group mark %+v, want done for about 1h, group billing of shop:orders.placed (topic orders.placed)", g)
	}
	if ns.Key != "valkeystream:dedup:emails:u-1" || ns.Namespace != "emails" || ns.Group != "" || ns.State != "done" {
		t.Errorf("namespace mark %+v, want done in namespace emails with no group", ns)
	}

	out := ok(t, addr, "dedup", "show", "u-1")
	for _, want := range []string{"STATE", "done", "billing", "emails", "shop:orders.placed:billing:u-1"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !anHourLess.MatchString(out) {
		t.Errorf("table lacks the TTL left of a mark kept for an hour:\n%s", out)
	}
	for _, args := range [][]string{
		{"u-1", "orders.placed", "billing", "--prefix", "shop:"},
		{"u-1", "shop:orders.placed", "billing"},
	} {
		got := decode[[]mark](t, ok(t, addr, append([]string{"dedup", "show", "--json"}, args...)...))
		if len(got) != 1 || got[0].Group != "billing" {
			t.Errorf("dedup show %v: got %+v, want the group's mark only", args, got)
		}
	}
	if got := decode[[]mark](t, ok(t, addr, "dedup", "show", "u-1", "--namespace", "emails", "--json")); len(got) != 1 || got[0].Namespace != "emails" {
		t.Errorf("--namespace emails: got %+v, want that mark only", got)
	}

	// In progress while a handler runs.
	running, release := make(chan struct{}), make(chan struct{})
	go handled(t, newDedup(t, c, ""), "u-3", func() { close(running); <-release })
	<-running
	got := decode[[]mark](t, ok(t, addr, "dedup", "show", "u-3", "--json"))
	close(release)
	if len(got) != 1 || got[0].State != "in-progress" || got[0].Holder == "" || got[0].TTLMS <= 0 {
		t.Errorf("running handler: got %+v, want one in-progress mark with its holder and a TTL", got)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"u-9"}, 1, "message u-9 has no deduplication mark"},
		{[]string{"u-1", "orders.placed"}, 2, "give the topic or stream and the group, or neither"},
		{[]string{"u-1", "s", "g", "--namespace", "n"}, 2, "not both"},
	} {
		r := cli(t, addr, "", append([]string{"dedup", "show"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("dedup show %v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}

func TestDedupClear(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	addr := srv.Addr()
	ctx := context.Background()
	d := newDedup(t, c, "")
	const key = "valkeystream:dedup:shop:orders.placed:billing:u-1"
	handled(t, d, "u-1", func() {})
	if handled(t, d, "u-1", func() {}) {
		t.Fatal("a duplicate ran the handler before the mark was cleared")
	}
	exists := func() bool { return c.Exists(ctx, key).Val() == 1 }

	for _, tc := range []struct {
		name, stdin string
		args        []string
		code        int
		want        string
	}{
		{"no answer", "", nil, 1, "pass --yes"},
		{"declined", "no\n", nil, 1, "nothing was changed"},
		{"dry run", "", []string{"--dry-run"}, 0, "would-clear"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, addr, tc.stdin, append([]string{"dedup", "clear", "u-1", "orders.placed", "billing", "--prefix", "shop:"}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
				t.Errorf("exit %d, output %q %q; want %d and %q", r.code, r.stdout, r.stderr, tc.code, tc.want)
			}
			if !exists() {
				t.Fatal("the mark is gone")
			}
		})
	}
	r := cli(t, addr, "y\n", "dedup", "clear", "u-1", "orders.placed", "billing", "--prefix", "shop:")
	if r.code != 0 || !strings.Contains(r.stdout, "cleared") || exists() {
		t.Fatalf("clear: exit %d, stdout %q, stderr %q, mark left %v; want it cleared", r.code, r.stdout, r.stderr, exists())
	}
	if !handled(t, d, "u-1", func() {}) {
		t.Error("the message was skipped after its mark was cleared, want it handled again")
	}

	// An in-progress mark is kept unless --in-progress.
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan bool)
	go func() { done <- handled(t, d, "u-2", func() { close(running); <-release }) }()
	<-running
	r = cli(t, addr, "", "dedup", "clear", "u-2", "--yes")
	if r.code != 1 || !strings.Contains(r.stdout, "kept-in-progress") || !strings.Contains(r.stderr, "--in-progress") {
		t.Errorf("in-progress: exit %d, stdout %q, stderr %q; want it kept and advice", r.code, r.stdout, r.stderr)
	}
	r = cli(t, addr, "", "dedup", "clear", "u-2", "--yes", "--in-progress")
	if r.code != 0 || !strings.Contains(r.stdout, "cleared") {
		t.Errorf("--in-progress: exit %d, stdout %q, stderr %q; want it cleared", r.code, r.stdout, r.stderr)
	}
	close(release)
	<-done

	// A mark that changes between the look and the removal is kept.
	handled(t, d, "u-3", func() {})
	cmd := exec.Command(binary, "dedup", "clear", "u-3")
	cmd.Env = append(os.Environ(), "VALKEYSTREAM_ADDR="+addr, "VALKEYSTREAM_URL=", "VALKEYSTREAM_KEY_PREFIX=")
	stdin, _ := cmd.StdinPipe()
	stderr, _ := cmd.StderrPipe()
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stderr).ReadString(']'); err != nil {
		t.Fatal(err)
	}
	key3 := "valkeystream:dedup:shop:orders.placed:billing:u-3"
	if err := c.Set(ctx, key3, "running:someone:1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(stdin, "y\n")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dedup clear: %v", err)
	}
	if !strings.Contains(stdout.String(), "changed") || c.Get(ctx, key3).Val() != "running:someone:1" {
		t.Errorf("changed mark: stdout %q, mark %q; want it reported changed and kept", stdout.String(), c.Get(ctx, key3).Val())
	}
}
