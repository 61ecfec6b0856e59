package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/partition"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The ACL of the tool's commands is documented in docs/design.md ("Keys,
// cluster slots and permissions"), as the library's is (see acl_test.go
// at the module's root, which says what is checked and why). These tests
// read the blocks, create the user of each, run the commands as that user,
// and check that the server refused nothing (ACL LOG) and that every
// command the block grants was sent.

const aclDocs = "../../docs/design.md"

// aclReset is the first line of every block: it resets the user.
const aclReset = "on >secret resetkeys resetchannels -@all"

// aclLine is one ACL SETUSER line of a block: its rules (after the user's
// name), and the condition its comment names, "" for none.
type aclLine struct {
	rules []string
	when  string
}

// aclBlock returns the lines of the fenced block under the heading
// "#### "+title in the permissions section of docs/design.md.
func aclBlock(t *testing.T, title string) []aclLine {
	t.Helper()
	data, err := os.ReadFile(aclDocs)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n### Keys, cluster slots and permissions\n")
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	_, rest, found := strings.Cut(section, "\n#### "+title+"\n")
	if !ok || !found {
		t.Fatalf("%s: no heading %q in its permissions section", aclDocs, "#### "+title)
	}
	if end := strings.Index(rest, "\n#### "); end >= 0 {
		rest = rest[:end]
	}
	_, rest, ok = strings.Cut(rest, "\n```\n")
	body, _, ended := strings.Cut(rest, "\n```\n")
	if !ok || !ended {
		t.Fatalf("%s, %q: no fenced block", aclDocs, title)
	}
	var lines []aclLine
	for _, text := range strings.Split(body, "\n") {
		rules, when, _ := strings.Cut(text, " # ")
		fields := strings.Fields(rules)
		if len(fields) <= 3 || fields[0] != "ACL" || fields[1] != "SETUSER" {
			t.Fatalf("%s, %q: %q is not an ACL SETUSER line with rules", aclDocs, title, text)
		}
		lines = append(lines, aclLine{rules: fields[3:], when: strings.TrimSpace(when)})
	}
	if got := strings.Join(lines[0].rules, " "); got != aclReset {
		t.Fatalf("%s, %q: the first line is %q, want the reset %q", aclDocs, title, got, aclReset)
	}
	return lines
}

// aclRun is one test's server and the user of a block.
type aclRun struct {
	t       *testing.T
	srv     *testserver.Server
	admin   *redis.Client // an unrestricted user's
	major   int           // of the server's own version
	minor   int
	user    string
	uses    map[string]bool // the uses a line's condition may name
	granted map[string]bool // the commands the block grants
	infos   int64           // the admin's INFO calls since the reset
}

func newACLRun(t *testing.T) *aclRun {
	t.Helper()
	srv := testserver.Start(t)
	var major, minor int
	if _, err := fmt.Sscanf(srv.Version(), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("server version %q: %v", srv.Version(), err)
	}
	return &aclRun{t: t, srv: srv, admin: newClient(t, srv), major: major, minor: minor, user: "acl-" + watermill.NewShortUUID(), granted: map[string]bool{}}
}

// holds reports whether a line whose comment names when applies: each of
// its comma-separated parts names a server the test knows, or a use the
// test declares.
func (r *aclRun) holds(when string) bool {
	if when == "" {
		return true
	}
	for _, part := range strings.Split(when, ", ") {
		var ok bool
		switch part {
		case "on Redis 6.2":
			ok = r.major < 7
		case "not on Redis 6.2":
			ok = r.major >= 7
		case "not on Redis 7.0":
			ok = r.srv.Name() != "redis" || r.major != 7 || r.minor != 0
		default:
			use, declared := r.uses[part]
			if !declared {
				r.t.Fatalf("%s: a line's condition %q names neither a server this test knows nor a use the test declares (%v)", aclDocs, part, r.uses)
			}
			ok = use
		}
		if !ok {
			return false
		}
	}
	return true
}

// grant creates the run's user with the lines of the block whose
// conditions hold, "orders" replaced by topic; then forgets what happened
// before (the cached scripts, the ACL LOG, the command counts).
func (r *aclRun) grant(title, topic string) {
	r.t.Helper()
	ctx := context.Background()
	for _, l := range aclBlock(r.t, title) {
		if !r.holds(l.when) {
			continue
		}
		args := []any{"ACL", "SETUSER", r.user}
		for _, rule := range l.rules {
			rule = strings.ReplaceAll(rule, "orders", topic)
			args = append(args, rule)
			if cmd, ok := strings.CutPrefix(rule, "+"); ok {
				if strings.HasPrefix(cmd, "@") {
					r.t.Fatalf("%s: %q grants a category: name the commands", aclDocs, rule)
				}
				r.granted[cmd] = true
			}
		}
		if err := r.admin.Do(ctx, args...).Err(); err != nil {
			r.t.Fatalf("ACL SETUSER %v: %v", args[3:], err)
		}
	}
	r.t.Cleanup(func() { _ = r.admin.Do(context.Background(), "ACL", "DELUSER", r.user).Err() })
	for _, cmd := range [][]any{{"SCRIPT", "FLUSH"}, {"ACL", "LOG", "RESET"}, {"CONFIG", "RESETSTAT"}} {
		if err := r.admin.Do(ctx, cmd...).Err(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// run runs the tool as the run's user, and fails the test unless it exits
// 0.
func (r *aclRun) run(args ...string) string {
	r.t.Helper()
	res := cliEnv(r.t, r.srv.Addr(), []string{"VALKEYSTREAM_USER=" + r.user, "VALKEYSTREAM_PASSWORD=secret"}, "", args...)
	if res.code != 0 {
		r.t.Errorf("valkeystream %s as the documented user: exit %d, want 0; stderr: %s", strings.Join(args, " "), res.code, res.stderr)
	}
	return res.stdout
}

// calls returns how many times the server ran each command since the
// reset, the admin's INFO calls left out.
func (r *aclRun) calls() map[string]int64 {
	r.t.Helper()
	info, err := r.admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
		if err != nil {
			r.t.Fatal(err)
		}
		counts[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	counts["info"] -= r.infos
	r.infos++
	return counts
}

// check fails the test for every refusal in ACL LOG, and for every command
// the block grants that the commands never sent.
func (r *aclRun) check() {
	r.t.Helper()
	log, err := r.admin.Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		r.t.Fatal(err)
	}
	if len(log) > 0 {
		r.t.Errorf("the server refused commands of the documented user (ACL LOG): %v", refusals(log))
	}
	calls := r.calls()
	var unsent []string
	for cmd := range r.granted {
		name := cmd
		if r.major < 7 {
			name, _, _ = strings.Cut(cmd, "|") // Redis 6.2 counts subcommands together
		}
		if calls[name] == 0 {
			unsent = append(unsent, cmd)
		}
	}
	slices.Sort(unsent)
	if len(unsent) > 0 {
		r.t.Errorf("%s grants commands the tool never sent: %v", aclDocs, unsent)
	}
}

// refusals describes the entries of an ACL LOG reply.
func refusals(log []any) []string {
	var out []string
	for _, entry := range log {
		fields := map[string]any{}
		switch en := entry.(type) {
		case map[any]any: // RESP3
			for k, v := range en {
				fields[fmt.Sprint(k)] = v
			}
		case []any: // RESP2
			for i := 0; i+1 < len(en); i += 2 {
				fields[fmt.Sprint(en[i])] = en[i+1]
			}
		}
		out = append(out, fmt.Sprintf("%v %q refused (%v, %v times)", fields["reason"], fields["object"], fields["context"], fields["count"]))
	}
	return out
}

// TestACLReadingCommands runs every reading command as the user of the
// docs' block, on a server that holds what each one shows: a stream with a
// group and pending entries, dead letters, a delayed message, a
// Deduplicator's mark and a partitioned topic with a live member.
func TestACLReadingCommands(t *testing.T) {
	testserver.Parallel(t)
	r := newACLRun(t)
	ctx := context.Background()
	c := r.admin
	deadLetters(t, c, "orders", 2)
	entries, err := c.XRange(ctx, "orders", "-", "+").Result()
	if err != nil || len(entries) == 0 {
		t.Fatalf("the stream's entries: %v (%d)", err, len(entries))
	}
	add(t, c, "orders", "pending-1", "p", nil)
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "worker-2", Streams: []string{"orders", ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	publishDelayed(t, c, "", "orders", "later", time.Hour, nil)
	if err := c.XGroupCreateMkStream(ctx, "shop:orders.placed", "billing", "$").Err(); err != nil {
		t.Fatal(err)
	}
	handled(t, newDedup(t, c, ""), "u-1", func() {})
	parts := map[string]int{"porders": 2}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c, Partitions: parts}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("porders", message.NewMessage(watermill.NewUUID(), nil)); err != nil {
		t.Fatal(err)
	}
	layout, err := partition.NewLayout("porders", 2)
	if err != nil {
		t.Fatal(err)
	}
	// A live member, whose record the membership script keeps.
	if err := c.ZAdd(ctx, layout.MembersKey("billing"), redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "w1"}).Err(); err != nil {
		t.Fatal(err)
	}
	r.uses = map[string]bool{}
	r.grant("The command-line tool's reading commands", "orders")

	r.run("streams")
	r.run("group", "orders")
	r.run("group", "orders", "billing")
	r.run("pending", "orders", "billing")
	r.run("entry", "orders", entries[0].ID)
	r.run("dead", "list", "orders")
	r.run("delayed", "list", "orders")
	r.run("delayed", "show", "orders", "later")
	r.run("dedup", "show", "u-1")
	r.run("dedup", "show", "u-1", "shop:orders.placed", "billing")
	r.run("partitions", "porders")
	if out := r.run("partitions", "porders", "billing", "--json"); !strings.Contains(out, `"w1"`) {
		t.Errorf("partitions with a group: the live member w1 is not listed:\n%s", out)
	}
	r.check()
}

// TestACLDeadReplay replays dead letters, with --dry-run first, as the user
// of the docs' block: of a plain topic, and of a partitioned one, whose dead
// letters go back to their partitions.
func TestACLDeadReplay(t *testing.T) {
	testserver.Parallel(t)
	for _, partitioned := range []bool{false, true} {
		name := "plain"
		if partitioned {
			name = "partitioned"
		}
		t.Run(name, func(t *testing.T) {
			r := newACLRun(t)
			ctx := context.Background()
			topic := "t" + strings.ToLower(watermill.NewShortUUID())
			var parts map[string]int
			if partitioned {
				parts = map[string]int{topic: 2}
			}
			uuids := deadLettersOf(t, r.admin, topic, parts, 2)
			r.uses = map[string]bool{"a plain topic": !partitioned, "a partitioned topic": partitioned}
			r.grant("`valkeystream dead replay`", topic)

			r.run("dead", "replay", topic, "--all", "--dry-run")
			r.run("dead", "replay", topic, "--all", "--yes")
			r.check()
			if n := r.admin.XLen(ctx, topic+valkeystream.DefaultDeadLetterSuffix).Val(); n != 0 {
				t.Errorf("%d dead letters left after the replay, want 0", n)
			}
			var back []string
			streams := []string{topic}
			if partitioned {
				layout, err := partition.NewLayout(topic, 2)
				if err != nil {
					t.Fatal(err)
				}
				streams = layout.Streams()
			}
			for _, s := range streams {
				back = append(back, streamUUIDs(t, r.admin, s)...)
			}
			for _, u := range uuids {
				if n := strings.Count(strings.Join(back, " "), u); n != 2 {
					t.Errorf("message %s is %d times in the topic's streams, want 2 (published, replayed)", u, n)
				}
			}
		})
	}
}

// deadLettersOf publishes n messages to topic (partitioned with parts,
// unless nil) and has a group's handler fail on each with the DeadLetter
// middleware, which moves them to the topic's dead-letter stream. It
// returns the messages' UUIDs.
func deadLettersOf(t *testing.T, c redis.UniversalClient, topic string, parts map[string]int, n int) []string {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c, Partitions: parts}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: c, ConsumerGroup: "billing", Consumer: "worker-1", Start: valkeystream.StartHead, Partitions: parts,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	dl, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: dead, MaxDeliveries: 1, Topic: topic + valkeystream.DefaultDeadLetterSuffix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	handler := dl(func(msg *message.Message) ([]*message.Message, error) {
		return nil, fmt.Errorf("card declined for %s", msg.UUID)
	})
	var uuids []string
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), message.Payload(strconv.Itoa(i)))
		m.Metadata.Set(valkeystream.MetadataPartitionKey, "key-"+strconv.Itoa(i))
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
		uuids = append(uuids, m.UUID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case msg := <-msgs:
			if _, err := handler(msg); err != nil {
				t.Fatalf("dead-lettering %s: %v", msg.UUID, err)
			}
			msg.Ack()
		case <-ctx.Done():
			t.Fatal("timed out waiting for the messages")
		}
	}
	return uuids
}
