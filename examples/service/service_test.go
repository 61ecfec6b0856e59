package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/examples/internal/e2e"
)

const (
	// orders is how many orders the test places.
	orders = 300
	// testReminderDelay is the service's -reminder-delay in the test.
	testReminderDelay = 3 * time.Second
	// settleTimeout bounds each wait for the service to catch up; a
	// restart after SIGKILL waits up to ConsumerLeaseTTL (10 s) for the dead
	// process' entries, and up to the Deduplicator's RunningTTL (10 s) for
	// the handling it killed.
	settleTimeout = 45 * time.Second
)

// An order service as users build it, run as a process: orders placed
// while it is SIGKILLed and restarted, poison orders dead-lettered, the
// rule fixed and the dead letters replayed with the valkeystream command.
// Every order is charged, shipped and reminded once; no reminder comes
// before its due time; nothing stays pending; the probes and metrics answer.
func TestService(t *testing.T) {
	t.Parallel() // beside TestPrometheusFiresTheLagAlert: each runs a server of its own
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := t.TempDir()
	serviceBin := filepath.Join(bin, "service")
	cliBin := filepath.Join(bin, "valkeystream")
	e2e.Build(ctx, t, serviceBin, ".", e2e.RaceEnabled)
	e2e.Build(ctx, t, cliBin, "github.com/echomq/valkeystream/cmd/valkeystream", false)

	srv := e2e.StartServer(ctx, t)
	t.Logf("server: %s at %s", srv.About, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	bus := testBus(t, client)

	svc := startService(ctx, t, serviceBin, srv.Addr, byFlags)

	// The orders: every 20th for the poison customer, every 25th for the
	// busy one, two with an invalid amount.
	placed := make([]*OrderPlaced, orders)
	var poison, invalid, busy []string
	for i := range placed {
		o := &OrderPlaced{OrderID: fmt.Sprintf("o%03d", i), Customer: "alice", Cents: int64(100 + i)}
		switch {
		case i == 7 || i == 211:
			o.Cents = 0
			invalid = append(invalid, o.OrderID)
		case i%20 == 10:
			o.Customer = poisonCustomer
			poison = append(poison, o.OrderID)
		case i%25 == 3:
			o.Customer = busyCustomer
			busy = append(busy, o.OrderID)
		}
		placed[i] = o
	}

	// Place them at a steady pace from a goroutine, and SIGKILL the
	// service once it has shipped a third: the rest arrive while it is
	// down and after its restart.
	placedAt := make([]time.Time, orders)
	published := make(chan error, 1)
	go func() {
		for i, o := range placed {
			placedAt[i] = time.Now()
			if err := bus.Publish(ctx, o); err != nil {
				published <- fmt.Errorf("publishing order %s: %w", o.OrderID, err)
				return
			}
			time.Sleep(3 * time.Millisecond) // the time is the scenario: orders placed over a while
		}
		published <- nil
	}()
	waitFor(ctx, t, "a third of the orders shipped", func() (bool, string) {
		n := countKeys(ctx, t, client, shippedKey("*"))
		return n >= orders/3, fmt.Sprintf("%d shipped", n)
	})
	svc.Kill(t)
	svc = startService(ctx, t, serviceBin, srv.Addr, byEnvironment)
	if err := <-published; err != nil {
		t.Fatal(err)
	}

	// Before the fix: everything but the poison and invalid orders is
	// charged, every order shipped and reminded; the poison and invalid
	// orders are dead letters.
	deadStream := "OrderPlaced" + valkeystream.DefaultDeadLetterSuffix
	waitFor(ctx, t, "the service to catch up before the fix", func() (bool, string) {
		charged := countKeys(ctx, t, client, chargeKey("*"))
		shipped := countKeys(ctx, t, client, shippedKey("*"))
		reminded := countKeys(ctx, t, client, remindedKey("*"))
		dead := deadLetters(ctx, t, client, deadStream)
		want := orders - len(poison) - len(invalid)
		return charged == want && shipped == orders && reminded == orders && dead == int64(len(poison)+len(invalid)),
			fmt.Sprintf("charged %d of %d, shipped %d, reminded %d of %d, dead letters %d of %d",
				charged, want, shipped, reminded, orders, dead, len(poison)+len(invalid))
	})
	for _, id := range append(poison, invalid...) {
		if n := client.Exists(ctx, chargeKey(id)).Val(); n != 0 {
			t.Fatalf("order %s charged before its rule was fixed", id)
		}
	}

	// The fix, then the replay, by the operator's command.
	if err := client.Set(ctx, poisonFixedKey, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	replay := exec.CommandContext(ctx, cliBin, "dead", "replay", "OrderPlaced", "--all", "--yes")
	replay.Env = append(os.Environ(), "VALKEYSTREAM_ADDR="+srv.Addr)
	out, err := replay.CombinedOutput()
	if err != nil {
		t.Fatalf("valkeystream dead replay: %v\n%s", err, out)
	}
	t.Logf("valkeystream dead replay OrderPlaced --all --yes:\n%s", out)

	// After it: the poison orders charged; the invalid ones given up again.
	waitFor(ctx, t, "the replayed orders to be handled and nothing left pending", func() (bool, string) {
		charged := countKeys(ctx, t, client, chargeKey("*"))
		dead := deadLetters(ctx, t, client, deadStream)
		pending := e2e.PendingEntries(ctx, t, client, "OrderPlaced", "PaymentReminderDue")
		want := orders - len(invalid)
		return charged == want && dead == int64(len(invalid)) && pending == 0,
			fmt.Sprintf("charged %d of %d, dead letters %d of %d, pending %d", charged, want, dead, len(invalid), pending)
	})
	// The console (without -v) says each dead-lettering: here, of the
	// invalid orders given up again after the replay.
	for _, id := range invalid {
		waitFor(ctx, t, "the console to say order "+id+" was dead-lettered", func() (bool, string) {
			for _, line := range strings.Split(svc.Output.String(), "\n") {
				if strings.Contains(line, "published to the dead-letter topic") && strings.Contains(line, "order-"+id) {
					return true, line
				}
			}
			return false, "no such line"
		})
	}

	for i, o := range placed {
		charge, err := client.Get(ctx, chargeKey(o.OrderID)).Result()
		switch {
		case slices.Contains(invalid, o.OrderID):
			if !errors.Is(err, redis.Nil) {
				t.Errorf("invalid order %s charged (%q, %v)", o.OrderID, charge, err)
			}
		case err != nil:
			t.Errorf("order %s not charged: %v", o.OrderID, err)
		case slices.Contains(busy, o.OrderID) && charge == chargeValue(1):
			t.Errorf("order %s of the busy customer charged on its first delivery, despite RetryAfter", o.OrderID)
		}
		if err := client.Get(ctx, shippedKey(o.OrderID)).Err(); err != nil {
			t.Errorf("order %s not shipped: %v", o.OrderID, err)
		}
		reminded, err := client.Get(ctx, remindedKey(o.OrderID)).Result()
		if err != nil {
			t.Errorf("order %s not reminded: %v", o.OrderID, err)
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, reminded)
		if err != nil {
			t.Fatalf("reminder time of order %s: %v", o.OrderID, err)
		}
		if due := placedAt[i].Add(testReminderDelay); at.Before(due) {
			t.Errorf("order %s reminded at %s, before it was due (placed %s + %s)",
				o.OrderID, at.Format(time.StampMicro), placedAt[i].Format(time.StampMicro), testReminderDelay)
		}
	}
	if n, _ := client.Get(ctx, earlyRemindersKey).Int(); n != 0 {
		t.Errorf("%d reminders handled before their due time", n)
	}
	// The effects are SET NX, so none is applied twice; a handling repeated
	// is counted. The Deduplicator leaves one possible repeat per handler:
	// the handling the SIGKILL interrupted after its effect and before its
	// done mark.
	for _, h := range []string{"billing", "shipping", "schedule-reminder", "send-reminder"} {
		n, _ := client.Get(ctx, repeatsKey(h)).Int()
		t.Logf("%s: %d handling(s) repeated after the SIGKILL", h, n)
		if n > 1 {
			t.Errorf("%s repeated %d handlings; one SIGKILL interrupts at most one", h, n)
		}
	}

	// The probes and the metrics, on the service's one HTTP server.
	if code, body := get(ctx, t, svc.url+"/readyz"); code != http.StatusOK || !strings.Contains(body, `"ready":true`) {
		t.Errorf("/readyz: %d %s", code, body)
	}
	if code, body := get(ctx, t, svc.url+"/livez"); code != http.StatusOK {
		t.Errorf("/livez: %d %s", code, body)
	}
	code, body := get(ctx, t, svc.url+"/metrics")
	for _, series := range []string{
		`valkeystream_subscriber_`,
		`valkeystream_publisher_`,
		`valkeystream_dedup_`,
		`valkeystream_dead_letters{stream="OrderPlaced"}`,
	} {
		if code != http.StatusOK || !strings.Contains(body, series) {
			t.Errorf("/metrics (status %d) serves no %s", code, series)
		}
	}

	svc.stop(t)
}

// service is the service running as a child process.
type service struct {
	*e2e.Process
	url   string
	start time.Duration // how long it took to become ready
}

// testBus returns the service's event bus on a Publisher of client, closed
// when the test ends: what the test places orders with.
func testBus(t *testing.T, client redis.UniversalClient) *cqrs.EventBus {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	bus, err := newEventBus(pub)
	if err != nil {
		t.Fatal(err)
	}
	return bus
}

// deadLetters returns how many messages stream holds dead letters of: a
// message dead-lettered twice (its process killed between its dead letter
// and its Ack, so that it was delivered and given up again) counts once.
func deadLetters(ctx context.Context, t *testing.T, client *redis.Client, stream string) int64 {
	t.Helper()
	entries, err := client.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	uuids := map[any]bool{}
	for _, e := range entries {
		uuids[e.Values[valkeystream.FieldUUID]] = true
	}
	return int64(len(uuids))
}

// How startService gives the service its server and HTTP addresses.
const (
	byFlags       = false // -addr and -http
	byEnvironment = true  // VALKEYSTREAM_ADDR and SERVICE_HTTP_ADDR
)

// startService starts the service binary against the server at addr, with
// an HTTP port the service picks itself (port 0: a port chosen here could
// be taken by another test's process before the service binds it, and its
// /readyz answered by that process), and waits until its first line has
// named its server and HTTP addresses and /readyz answers 200.
func startService(ctx context.Context, t *testing.T, bin, addr string, byEnv bool, extra ...string) *service {
	t.Helper()
	args := append([]string{"-reminder-delay", testReminderDelay.String(), "-sample-orders", "0"}, extra...)
	cmd := e2e.Command(bin, args, byEnv,
		e2e.Setting{Flag: "-addr", Env: "VALKEYSTREAM_ADDR", Value: addr},
		e2e.Setting{Flag: "-http", Env: "SERVICE_HTTP_ADDR", Value: "127.0.0.1:0"})
	began := time.Now()
	s := &service{Process: e2e.StartProcess(t, "service", cmd)}
	named := regexp.MustCompile(`at ` + regexp.QuoteMeta(addr) + ` \(the valkeystream command: VALKEYSTREAM_ADDR=` +
		regexp.QuoteMeta(addr) + `\); HTTP: (http://127\.0\.0\.1:[0-9]+) `)
	waitFor(ctx, t, "the service to name its server and HTTP addresses", func() (bool, string) {
		s.CheckRunning(t)
		m := named.FindStringSubmatch(s.Output.String())
		if m == nil {
			return false, "output: " + s.Output.String()
		}
		s.url = m[1]
		return true, ""
	})
	waitFor(ctx, t, "the service to be ready", func() (bool, string) {
		s.CheckRunning(t)
		code, body := get(ctx, t, s.url+"/readyz")
		return code == http.StatusOK, fmt.Sprintf("/readyz: %d %s", code, body)
	})
	s.start = time.Since(began)
	t.Logf("service started (pid %d), ready after %s", s.Cmd.Process.Pid, s.start.Round(time.Millisecond))
	return s
}

// stop is Stop with the service's 30s, checking too that the output holds
// its logger's lines.
func (s *service) stop(t *testing.T) {
	t.Helper()
	s.Stop(t, 30*time.Second)
	if !strings.Contains(s.Output.String(), "service: ") {
		t.Fatalf("the service did not stop cleanly (no line of its logger):\n%s", s.Output.String())
	}
}

// waitFor polls cond every 50ms until it holds, failing the test with
// cond's last description after settleTimeout.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	e2e.WaitFor(ctx, t, what, settleTimeout, 50*time.Millisecond, cond)
}

// countKeys counts the keys matching pattern.
func countKeys(ctx context.Context, t *testing.T, c *redis.Client, pattern string) int {
	t.Helper()
	n := 0
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// get fetches url, returning its status and body (status 0 when the
// request failed).
func get(ctx context.Context, t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(body)
}
