package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// publishDelayed publishes a message to topic through a Publisher with
// KeyPrefix prefix, delayed by d.
func publishDelayed(t *testing.T, c redis.UniversalClient, prefix, topic, uuid string, d time.Duration, md map[string]string) {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: c, KeyPrefix: prefix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(uuid, message.Payload(`{"order":`+uuid+`}`))
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	delay.Message(msg, delay.For(d))
	if err := pub.Publish(topic, msg); err != nil {
		t.Fatal(err)
	}
}

func TestDelayedList(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	addr := srv.Addr()
	publishDelayed(t, c, "shop:", "orders.placed", "third", 3*time.Hour, nil)
	publishDelayed(t, c, "shop:", "orders.placed", "first", time.Hour, nil)
	publishDelayed(t, c, "shop:", "orders.placed", "second", 2*time.Hour, nil)
	publishDelayed(t, c, "shop:", "orders.placed", "due", time.Millisecond, nil) // no subscription moves it
	publishDelayed(t, c, "shop:", "other", "elsewhere", time.Hour, nil)
	time.Sleep(5 * time.Millisecond) // the time is the scenario: past the due time of "due"

	for _, name := range []string{"orders.placed", "shop:orders.placed"} {
		r := cli(t, addr, "", "delayed", "list", name, "--prefix", "shop:", "--json")
		if r.code != 0 {
			t.Fatalf("delayed list %s: exit %d, stderr %s", name, r.code, r.stderr)
		}
		sum := decode[delayedSummary](t, r.stdout)
		if sum.Stream != "shop:orders.placed" || sum.Topic != "orders.placed" || sum.DelayedKey != "{shop:orders.placed}:delayed" {
			t.Errorf("%s: got stream %q topic %q set %q, want shop:orders.placed, orders.placed, {shop:orders.placed}:delayed", name, sum.Stream, sum.Topic, sum.DelayedKey)
		}
		var uuids []string
		for _, m := range sum.Messages {
			uuids = append(uuids, m.UUID)
		}
		if sum.Waiting != 4 || sum.PastDue != 1 || strings.Join(uuids, ",") != "due,first,second,third" {
			t.Errorf("%s: got %d waiting, %d past due, %v; want 4, 1, due,first,second,third", name, sum.Waiting, sum.PastDue, uuids)
		}
		if m := sum.Messages[1]; m.InMS < 59*60*1000 || m.InMS > 60*60*1000 || m.Topic != "orders.placed" || m.PayloadBytes != len(`{"order":first}`) {
			t.Errorf("%s: first: got %+v, want due in about 1h, topic orders.placed, 15 bytes", name, m)
		}
		if sum.NextDue != sum.Messages[0].Due || sum.LastDue != sum.Messages[3].Due {
			t.Errorf("%s: next due %q, last due %q; want %q and %q", name, sum.NextDue, sum.LastDue, sum.Messages[0].Due, sum.Messages[3].Due)
		}
		if !strings.Contains(r.stderr, "1 are past due") {
			t.Errorf("%s: stderr %q does not say one is past due", name, r.stderr)
		}
	}

	r := cliEnv(t, addr, []string{"VALKEYSTREAM_KEY_PREFIX=shop:"}, "", "delayed", "list", "orders.placed", "--limit", "2")
	out := r.stdout
	for _, want := range []string{"{shop:orders.placed}:delayed", "WAITING", "past due", "first", "orders.placed"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !inAnHourLess.MatchString(out) {
		t.Errorf("table lacks when the first message is due, in about an hour:\n%s", out)
	}
	if strings.Contains(out, "second") || !strings.Contains(r.stderr, "showing the first 2 of 4") {
		t.Errorf("--limit 2: stdout\n%s\nstderr %q; want two messages and a note", out, r.stderr)
	}

	r = cli(t, addr, "", "delayed", "list", "none", "--prefix", "shop:")
	if r.code != 0 || !strings.Contains(r.stderr, "no delayed messages wait") {
		t.Errorf("no delayed messages: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestDelayedShow(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	addr := srv.Addr()
	publishDelayed(t, c, "shop:", "orders.placed", "u-1", time.Hour, map[string]string{"customer": "cust-42"})
	publishDelayed(t, c, "shop:", "orders.placed", "u-2", time.Hour, nil)

	got := decode[[]delayedMessage](t, ok(t, addr, "delayed", "show", "orders.placed", "u-1", "--prefix", "shop:", "--json"))
	if len(got) != 1 || got[0].UUID != "u-1" || got[0].Metadata["customer"] != "cust-42" || got[0].Payload != `{"order":u-1}` {
		t.Fatalf("got %+v, want u-1 with customer cust-42 and its payload", got)
	}
	if got[0].Metadata[delay.DelayedForKey] != "1h0m0s" {
		t.Errorf("metadata %v lacks the delay", got[0].Metadata)
	}
	out := ok(t, addr, "delayed", "show", "shop:orders.placed", "u-1", "--prefix", "shop:", "--payload-bytes", "4")
	for _, want := range []string{"topic", "orders.placed", "delayed set", "{shop:orders.placed}:delayed", "due", "uuid", "metadata customer", "cust-42", `{"or... (13 bytes)`} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !inAnHourLess.MatchString(out) {
		t.Errorf("table lacks when the message is due, in about an hour:\n%s", out)
	}
	r := cli(t, addr, "", "delayed", "show", "orders.placed", "u-3", "--prefix", "shop:")
	if r.code != 1 || !strings.Contains(r.stderr, "no delayed message with UUID u-3") {
		t.Errorf("unknown UUID: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestDelayedCancel(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	addr := srv.Addr()
	for _, u := range []string{"u-1", "u-2", "u-3"} {
		publishDelayed(t, c, "shop:", "orders.placed", u, time.Hour, nil)
	}
	const set = "{shop:orders.placed}:delayed"
	waiting := func() int64 { return c.ZCard(context.Background(), set).Val() }
	env := []string{"VALKEYSTREAM_KEY_PREFIX=shop:"}

	for _, tc := range []struct {
		name, stdin string
		args        []string
		code        int
		want        string
	}{
		{"says which", "", []string{"orders.placed"}, 2, "their UUIDs, or --all"},
		{"UUIDs or all", "", []string{"orders.placed", "u-1", "--all"}, 2, "leave out the UUIDs"},
		{"no answer", "", []string{"orders.placed", "u-1"}, 1, "pass --yes"},
		{"declined", "n\n", []string{"orders.placed", "--all"}, 1, "nothing was changed"},
		{"dry run", "", []string{"orders.placed", "--all", "--dry-run"}, 0, "would-cancel"},
		{"unknown UUID", "", []string{"orders.placed", "u-9", "--yes"}, 1, "no delayed message with UUID u-9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cliEnv(t, addr, env, tc.stdin, append([]string{"delayed", "cancel"}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
				t.Errorf("exit %d, output %q %q; want %d and %q", r.code, r.stdout, r.stderr, tc.code, tc.want)
			}
			if n := waiting(); n != 3 {
				t.Errorf("%d delayed messages wait, want all 3 still", n)
			}
		})
	}

	r := cliEnv(t, addr, env, "", "delayed", "cancel", "orders.placed", "u-2", "u-9", "--yes", "--json")
	res := decode[[]cancelResult](t, r.stdout)
	if r.code != 0 || len(res) != 1 || res[0].UUID != "u-2" || res[0].Result != "cancelled" || !strings.Contains(r.stderr, "no delayed message waits with UUID u-9") {
		t.Errorf("cancel u-2: exit %d, %+v, stderr %q; want u-2 cancelled and u-9 reported missing", r.code, res, r.stderr)
	}
	if n := waiting(); n != 2 {
		t.Errorf("%d wait after cancelling one, want 2", n)
	}
	r = cliEnv(t, addr, env, "y\n", "delayed", "cancel", "shop:orders.placed", "--all")
	if r.code != 0 || strings.Count(r.stdout, "cancelled") != 2 || !strings.Contains(r.stderr, "Cancel 2 delayed messages") {
		t.Errorf("cancel --all: exit %d, stdout\n%s\nstderr %q; want 2 cancelled after the question", r.code, r.stdout, r.stderr)
	}
	if n := waiting(); n != 0 {
		t.Errorf("%d wait after cancelling all, want 0", n)
	}
	if n := c.Exists(context.Background(), "shop:orders.placed").Val(); n != 0 {
		t.Errorf("the stream exists after every message was cancelled: a cancelled message was appended")
	}
}

// A cancel that races with a running Subscriber's mover cancels or leaves
// each message, never both: the messages it reports "gone" are the ones the
// Subscriber delivered, and the ones it cancelled never arrive.
func TestDelayedCancelRacesTheMover(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	c := newClient(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// 40 messages due 50 ms apart, from 3 s on: the command, started
	// meanwhile, finds them all waiting, even on a loaded machine.
	const n, lead, gap = 40, 3 * time.Second, 50 * time.Millisecond
	start := time.Now()
	for i := range n {
		publishDelayed(t, c, "shop:", "orders.placed", fmt.Sprintf("m-%02d", i), lead+time.Duration(i)*gap, nil)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: c, ConsumerGroup: "billing", Start: valkeystream.StartHead, KeyPrefix: "shop:", DelayedPollInterval: 5 * time.Millisecond,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders.placed")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	delivered := map[string]int{}
	go func() {
		for m := range msgs {
			mu.Lock()
			delivered[m.UUID]++
			mu.Unlock()
			m.Ack()
		}
	}()

	// The command finds every message waiting, then asks; it is answered
	// when about half are due, so the mover moves some of those it found
	// before it removes them.
	cmd := exec.CommandContext(ctx, binary, "delayed", "cancel", "orders.placed", "--all", "--json")
	cmd.Env = append(os.Environ(), "VALKEYSTREAM_ADDR="+srv.Addr(), "VALKEYSTREAM_URL=", "VALKEYSTREAM_KEY_PREFIX=shop:")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	asked := bufio.NewReader(stderr)
	question, err := asked.ReadString(']')
	if err != nil || !strings.Contains(question, fmt.Sprintf("Cancel %d delayed messages", n)) {
		t.Fatalf("the command asked %q (%v), want it to find all %d waiting", question, err, n)
	}
	t.Logf("the command asked %s after the first publish", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Until(start.Add(lead + n/2*gap))) // the time is the scenario: about half are due when it is answered
	if _, err := io.WriteString(stdin, "y\n"); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(asked)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("delayed cancel: %v; stderr %s", err, rest)
	}
	results := decode[[]cancelResult](t, stdout.String())

	// Every message is due by now: wait until the Subscriber has what was
	// moved, and a little more for any that would come late.
	gone := map[string]bool{}
	cancelled := 0
	for _, r := range results {
		switch r.Result {
		case "gone":
			gone[r.UUID] = true
		case "cancelled":
			cancelled++
		default:
			t.Errorf("message %s: result %q, want cancelled or gone", r.UUID, r.Result)
		}
	}
	time.Sleep(time.Until(start.Add(lead + n*gap))) // the time is the scenario: every message is due
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := len(delivered)
		mu.Unlock()
		if got >= len(gone) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the poll of a wait for the moved messages
	}
	time.Sleep(300 * time.Millisecond) // the time is the scenario: any that would come late

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d cancelled, %d moved before their removal", cancelled, len(gone))
	if len(results) != n || cancelled+len(gone) != n {
		t.Fatalf("%d results (%d cancelled, %d gone), want %d", len(results), cancelled, len(gone), n)
	}
	for u, k := range delivered {
		if !gone[u] {
			t.Errorf("message %s was delivered, but the command reported it cancelled", u)
		}
		if k != 1 {
			t.Errorf("message %s was delivered %d times", u, k)
		}
	}
	for u := range gone {
		if delivered[u] == 0 {
			t.Errorf("message %s was reported gone (moved), but never delivered", u)
		}
	}
	if cancelled == 0 || len(gone) == 0 {
		t.Errorf("%d cancelled and %d gone: the cancel did not race with the mover", cancelled, len(gone))
	}
	if w := c.ZCard(ctx, "{shop:orders.placed}:delayed").Val(); w != 0 {
		t.Errorf("%d messages still wait, want 0", w)
	}
}
