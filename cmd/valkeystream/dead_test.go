package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// deadLetters publishes n messages to topic and has a group's handler fail
// on each with the DeadLetter middleware, which moves them to topic.dead.
// It returns the messages' UUIDs.
func deadLetters(t *testing.T, c redis.UniversalClient, topic string, n int) []string {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: c, ConsumerGroup: "billing", Consumer: "worker-1", Start: valkeystream.StartHead,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	dl, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 1, Topic: topic + valkeystream.DefaultDeadLetterSuffix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	handler := dl(func(msg *message.Message) ([]*message.Message, error) {
		return nil, fmt.Errorf("card declined for %s", msg.UUID)
	})
	var uuids []string
	for i := range n {
		m := message.NewMessage(fmt.Sprintf("order-%d", i), message.Payload(fmt.Sprintf(`{"n":%d}`, i)))
		m.Metadata.Set("customer", fmt.Sprintf("cust-%d", i))
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

func TestDeadList(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	uuids := deadLetters(t, c, "orders", 3)

	got := decode[[]deadLetter](t, ok(t, srv.Addr(), "dead", "list", "orders.dead", "--json"))
	if len(got) != 3 {
		t.Fatalf("got %d dead letters, want 3: %+v", len(got), got)
	}
	for i, d := range got {
		if d.UUID != uuids[i] || d.OriginStream != "orders" || d.Group != "billing" || d.Consumer != "worker-1" ||
			d.Deliveries != "1" || d.Error != "card declined for "+uuids[i] || d.OriginEntryID == "" {
			t.Errorf("dead letter %d: got %+v, want UUID %s from orders, billing, worker-1, 1 delivery, its error", i, d, uuids[i])
		}
	}

	out := ok(t, srv.Addr(), "dead", "list", "orders.dead")
	checkAligned(t, out)
	if rows := columns(out); len(rows) != 4 || rows[1][1] != uuids[0] || rows[1][2] != "orders" {
		t.Errorf("table:\n%s\nwant 3 rows, the first %s from orders", out, uuids[0])
	}

	got = decode[[]deadLetter](t, ok(t, srv.Addr(), "dead", "list", "orders.dead", "--json", "--error-contains", uuids[1]))
	if len(got) != 1 || got[0].UUID != uuids[1] {
		t.Errorf("--error-contains: got %+v, want only %s", got, uuids[1])
	}

	r := cli(t, srv.Addr(), "", "dead", "list", "nope.dead")
	if r.code != 1 || !strings.Contains(r.stderr, `dead-letter stream "nope.dead" does not exist`) {
		t.Errorf("missing stream: exit %d, stderr %q", r.code, r.stderr)
	}
}

// streamUUIDs returns the uuid field of every entry of stream, in order.
func streamUUIDs(t *testing.T, c redis.Cmdable, stream string) []string {
	t.Helper()
	msgs, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range msgs {
		out = append(out, fieldText(m.Values[valkeystream.FieldUUID]))
	}
	return out
}

func TestDeadReplay(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ctx := context.Background()
	uuids := deadLetters(t, c, "orders", 4)
	letters := decode[[]deadLetter](t, ok(t, srv.Addr(), "dead", "list", "orders.dead", "--json"))
	before := streamUUIDs(t, c, "orders")

	// A dry run changes nothing, and says which groups each replay reaches:
	// the one that gave up on it, or with --all-groups every group.
	if err := c.XGroupCreate(ctx, "orders", "shipping", "0").Err(); err != nil {
		t.Fatal(err)
	}
	plan := decode[[]replayResult](t, ok(t, srv.Addr(), "dead", "replay", "orders.dead", "--all", "--dry-run", "--json"))
	if len(plan) != 4 || plan[0].Result != "would-append" || plan[0].Stream != "orders" {
		t.Errorf("dry run: got %+v, want 4 would-append to orders", plan)
	}
	if plan[0].ForGroup != "billing" || strings.Join(plan[0].Groups, ",") != "billing" {
		t.Errorf("dry run: for group %q, reaches %v; want billing only", plan[0].ForGroup, plan[0].Groups)
	}
	everyone := decode[[]replayResult](t, ok(t, srv.Addr(), "dead", "replay", "orders.dead", "--all", "--all-groups", "--dry-run", "--json"))
	if everyone[0].ForGroup != "" || len(everyone[0].Groups) != 2 {
		t.Errorf("dry run with --all-groups: for group %q, reaches %v; want every group (billing, shipping)", everyone[0].ForGroup, everyone[0].Groups)
	}
	// So does a refusal, and no answer at all.
	for _, stdin := range []string{"n\n", ""} {
		r := cli(t, srv.Addr(), stdin, "dead", "replay", "orders.dead", "--all")
		if r.code != 1 || !strings.Contains(r.stderr, "not confirmed") || !strings.Contains(r.stderr, "Append 4 dead letters") {
			t.Errorf("stdin %q: exit %d, stderr %q; want 1 and the question, not confirmed", stdin, r.code, r.stderr)
		}
	}
	if got := streamUUIDs(t, c, "orders"); len(got) != len(before) {
		t.Fatalf("orders has %d entries after the dry run and refusals, want %d", len(got), len(before))
	}

	// One by id, confirmed on stdin.
	r := cli(t, srv.Addr(), "y\n", "dead", "replay", "orders.dead", "--id", letters[0].ID)
	if r.code != 0 {
		t.Fatalf("replay by id: exit %d, stderr %s", r.code, r.stderr)
	}
	if rows := columns(r.stdout); len(rows) != 2 || rows[1][0] != letters[0].ID || rows[1][3] != "billing" || rows[1][4] != "appended" {
		t.Errorf("replay table:\n%s\nwant %s appended", r.stdout, letters[0].ID)
	}
	msgs, err := c.XRevRangeN(ctx, "orders", "+", "-", 1).Result()
	if err != nil {
		t.Fatal(err)
	}
	replayed, err := valkeystream.DefaultMarshaler{}.Unmarshal(msgs[0].Values)
	if err != nil {
		t.Fatalf("the replayed entry does not decode: %v", err)
	}
	if replayed.UUID != uuids[0] || string(replayed.Payload) != `{"n":0}` || replayed.Metadata.Get("customer") != "cust-0" {
		t.Errorf("replayed %s %q %v, want %s {\"n\":0} customer=cust-0", replayed.UUID, replayed.Payload, replayed.Metadata, uuids[0])
	}
	if g := replayed.Metadata.Get(valkeystream.MetadataReplayGroup); g != "billing" {
		t.Errorf("the replayed entry is for group %q, want billing (the group that gave up on it)", g)
	}
	for _, k := range deadKeys {
		if _, has := replayed.Metadata[k]; has {
			t.Errorf("the replayed message keeps dead-letter key %s", k)
		}
	}

	// An interrupted run: the second dead letter was appended, and the run
	// stopped before deleting it.
	l1 := toDeadLetter(mustRange(t, c, "orders.dead", letters[1].ID))
	args := append([]any{markerField("orders.dead", l1.ID), 60}, replayFields(l1.fields, "")...)
	if err := replayScript.Run(ctx, c, []string{"orders", markerKey("orders")}, args...).Err(); err != nil {
		t.Fatal(err)
	}

	// Running again finishes the job: every dead letter in orders once.
	res := decode[[]replayResult](t, ok(t, srv.Addr(), "dead", "replay", "orders.dead", "--all", "--yes", "--json"))
	results := map[string]string{}
	for _, rr := range res {
		results[rr.UUID] = rr.Result
	}
	want := map[string]string{uuids[1]: "already-appended", uuids[2]: "appended", uuids[3]: "appended"}
	if fmt.Sprint(results) != fmt.Sprint(want) {
		t.Errorf("results %v, want %v", results, want)
	}
	after := streamUUIDs(t, c, "orders")
	if want := append(before, uuids...); fmt.Sprint(after) != fmt.Sprint(want) {
		t.Errorf("orders holds %v, want %v: each dead letter once, in order", after, want)
	}
	if n := c.XLen(ctx, "orders.dead").Val(); n != 0 {
		t.Errorf("orders.dead holds %d entries, want 0", n)
	}

	// And a third run has nothing to do.
	r = cli(t, srv.Addr(), "", "dead", "replay", "orders.dead", "--all", "--yes")
	if r.code != 0 || !strings.Contains(r.stderr, "nothing to replay") {
		t.Errorf("third run: exit %d, stderr %q", r.code, r.stderr)
	}
	if got := streamUUIDs(t, c, "orders"); len(got) != len(after) {
		t.Errorf("orders has %d entries after a third run, want %d", len(got), len(after))
	}
}

func mustRange(t *testing.T, c *redis.Client, stream, id string) redis.XMessage {
	t.Helper()
	msgs, err := c.XRange(context.Background(), stream, id, id).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("XRANGE %s %s: %v %v", stream, id, msgs, err)
	}
	return msgs[0]
}

// Two runs at once append each dead letter once.
func TestDeadReplayConcurrent(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	uuids := deadLetters(t, c, "orders", 20)
	before := streamUUIDs(t, c, "orders")
	done := make(chan result, 2)
	for range 2 {
		go func() {
			done <- cli(t, srv.Addr(), "", "dead", "replay", "orders.dead", "--all", "--yes")
		}()
	}
	for range 2 {
		if r := <-done; r.code != 0 {
			t.Errorf("exit %d, stderr %s", r.code, r.stderr)
		}
	}
	after := streamUUIDs(t, c, "orders")
	if want := append(before, uuids...); fmt.Sprint(after) != fmt.Sprint(want) {
		t.Errorf("orders holds %d entries %v, want %d: each dead letter once", len(after), after, len(want))
	}
}

func TestMarkerKeySameSlot(t *testing.T) {
	for _, key := range []string{"orders", "{tenant}orders", "app:{x}:orders", "a{b", "x{"} {
		if got, want := redisSlot(markerKey(key)), redisSlot(key); got != want {
			t.Errorf("markerKey(%q) = %q in slot %d, want slot %d", key, markerKey(key), got, want)
		}
	}
	if got, want := markerKey("a{}b"), "a{}b:valkeystream-replayed"; got != want {
		t.Errorf("markerKey(a{}b) = %q, want %q", got, want)
	}
}

// redisSlot is the cluster hash slot of key, as the servers compute it.
func redisSlot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

func TestPrune(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ctx := context.Background()
	add(t, c, "s", "u1", "p", nil)
	if err := c.XGroupCreate(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// busy holds an entry; idle-1 and idle-2 hold nothing.
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "busy", Streams: []string{"s", ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"idle-1", "idle-2"} {
		if err := c.XGroupCreateConsumer(ctx, "s", "g", name).Err(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // so that all three are idle for 20ms

	dry := decode[[]pruneResult](t, ok(t, srv.Addr(), "prune", "s", "g", "--idle", "20ms", "--dry-run", "--json"))
	if len(dry) != 2 || dry[0].Result != "would-remove" {
		t.Errorf("dry run: got %+v, want idle-1 and idle-2 would-remove", dry)
	}
	r := cli(t, srv.Addr(), "", "prune", "s", "g", "--idle", "20ms")
	if r.code != 1 || !strings.Contains(r.stderr, "pass --yes") {
		t.Errorf("no answer: exit %d, stderr %q", r.code, r.stderr)
	}
	r = cli(t, srv.Addr(), "yes\n", "prune", "s", "g", "--idle", "20ms")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %s", r.code, r.stderr)
	}
	rows := columns(r.stdout)
	if len(rows) != 3 || rows[1][0] != "idle-1" || rows[1][2] != "removed" || rows[2][2] != "removed" {
		t.Errorf("table:\n%s\nwant idle-1 and idle-2 removed", r.stdout)
	}
	consumers, err := c.XInfoConsumers(ctx, "s", "g").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(consumers) != 1 || consumers[0].Name != "busy" || consumers[0].Pending != 1 {
		t.Errorf("consumers left %+v, want busy with its pending entry", consumers)
	}
}

// The script checks again at the moment of removal.
func TestPruneScriptRechecks(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ctx := context.Background()
	add(t, c, "s", "u1", "p", nil)
	c.XGroupCreate(ctx, "s", "g", "0")
	c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "busy", Streams: []string{"s", ">"}, Count: 1, Block: -1})
	c.XGroupCreateConsumer(ctx, "s", "g", "fresh")
	tests := []struct {
		consumer string
		minIdle  int64
		want     int64
	}{
		{"busy", 0, -1},        // holds an entry
		{"fresh", 3600000, -2}, // not idle for an hour
		{"ghost", 0, 0},        // not there
		{"fresh", 0, 1},        // removed
	}
	for _, tc := range tests {
		got, err := pruneScript.Run(ctx, c, []string{"s"}, "g", tc.consumer, tc.minIdle).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s with min idle %dms: got %d, want %d", tc.consumer, tc.minIdle, got, tc.want)
		}
	}
}
