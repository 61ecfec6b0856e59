package valkeystream_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// waitReport polls check until ok accepts its report, or fails the test
// after a generous bound.
func waitReport(t *testing.T, check *valkeystream.HealthCheck, what string, ok func(valkeystream.HealthReport) bool) valkeystream.HealthReport {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := check.Check()
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 60s for %s; last report %+v", what, r)
		}
		time.Sleep(20 * time.Millisecond) // the poll interval
	}
}

// A subscription whose calls fail longer than FailingFor is unhealthy with
// the reason, and healthy again once the server is back.
func TestHealthServerOutage(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	if !srv.Restartable() {
		t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be restarted by the test")
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Consumer: "c", Start: valkeystream.StartHead,
		BlockTime: 100 * time.Millisecond,
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	check, err := valkeystream.NewHealthCheck(valkeystream.HealthConfig{
		Subscribers: []*valkeystream.Subscriber{sub}, FailingFor: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	if r := check.Check(); r.Ready || !r.Healthy || len(r.Problems) != 1 || r.Problems[0] != "no subscriptions yet" {
		t.Errorf("before Subscribe: got %+v, want healthy, not ready, no subscriptions yet", r)
	}
	if _, err := sub.Subscribe(context.Background(), "health"); err != nil {
		t.Fatal(err)
	}
	r := check.Check()
	if !r.Healthy || !r.Ready || len(r.Subscriptions) != 1 {
		t.Fatalf("after Subscribe: got %+v, want healthy and ready with one subscription", r)
	}
	if st := r.Subscriptions[0]; st.Topic != "health" || st.Stream != "health" || st.Group != "g" || st.Consumer != "c" || !st.Ready {
		t.Errorf("subscription %+v, want topic health, group g, consumer c, ready", st)
	}

	// Taken before Kill, which returns only once the process is reaped:
	// the subscription's calls may begin failing before Kill returns.
	down := time.Now()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	r = waitReport(t, check, "unhealthy while the server is down", func(r valkeystream.HealthReport) bool { return !r.Healthy })
	if elapsed := time.Since(down); elapsed < 300*time.Millisecond {
		t.Errorf("unhealthy %s after the server went down, want at least FailingFor (300ms)", elapsed)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "calls to the server have been failing for") ||
		!strings.Contains(r.Problems[0], `group "g"`) {
		t.Errorf("problems %q, want one that says the calls of group g have been failing", r.Problems)
	}
	if st := r.Subscriptions[0]; st.Failures == 0 || st.LastError == "" || st.FailingSince.IsZero() {
		t.Errorf("status %+v, want failures, the last error and since when", st)
	}

	h := httptest.NewRecorder()
	check.LiveHandler().ServeHTTP(h, httptest.NewRequest(http.MethodGet, "/livez", nil))
	if h.Code != http.StatusServiceUnavailable {
		t.Errorf("live handler while down: status %d, want 503", h.Code)
	}
	var body valkeystream.HealthReport
	if err := json.Unmarshal(h.Body.Bytes(), &body); err != nil || body.Healthy || len(body.Problems) == 0 {
		t.Errorf("live handler body %s (%v), want an unhealthy report with its problems", h.Body, err)
	}

	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	// Healthy comes before the streak of failures ends: a call that fails
	// just after the restart (a connection dialled before the server
	// listened) starts a new streak, healthy until FailingFor. Wait for a
	// call that succeeds.
	waitReport(t, check, "healthy, ready and no failures after the server came back", func(r valkeystream.HealthReport) bool {
		return r.Healthy && r.Ready && len(r.Problems) == 0 && r.Subscriptions[0].Failures == 0
	})
	h = httptest.NewRecorder()
	check.ReadyHandler().ServeHTTP(h, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if h.Code != http.StatusOK {
		t.Errorf("ready handler after recovery: status %d, want 200; body %s", h.Code, h.Body)
	}
}

// A subscription whose context ends is reported as ended, and a closed
// Subscriber as closed; a new subscription to the same stream replaces the
// ended one.
func TestHealthEnded(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	client := newClient(t, srv)
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Start: valkeystream.StartHead, BlockTime: 50 * time.Millisecond,
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	check, err := valkeystream.NewHealthCheck(valkeystream.HealthConfig{Subscribers: []*valkeystream.Subscriber{sub}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, "ended")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range msgs {
	}
	r := waitReport(t, check, "the ended subscription", func(r valkeystream.HealthReport) bool { return !r.Healthy })
	if r.Ready || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "has ended") || !r.Subscriptions[0].Ended {
		t.Errorf("got %+v, want unhealthy, not ready, one subscription that has ended", r)
	}

	if _, err := sub.Subscribe(context.Background(), "ended"); err != nil {
		t.Fatal(err)
	}
	if r := check.Check(); !r.Healthy || !r.Ready || len(r.Subscriptions) != 1 {
		t.Errorf("after subscribing again: got %+v, want healthy and ready with one subscription", r)
	}

	// A refused door leaves nothing behind.
	if err := client.Set(context.Background(), "not-a-stream", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var gce *valkeystream.GroupCreateError
	if _, err := sub.Subscribe(context.Background(), "not-a-stream"); !errors.As(err, &gce) {
		t.Fatalf("Subscribe to a string key: %v, want a GroupCreateError", err)
	}
	if n := len(sub.Subscriptions()); n != 1 {
		t.Errorf("%d subscriptions listed after a refused door, want 1", n)
	}

	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	r = check.Check()
	if r.Healthy || !strings.Contains(strings.Join(r.Problems, "; "), "a subscriber is closed") {
		t.Errorf("after Close: got %+v, want unhealthy: a subscriber is closed", r)
	}
}

func TestHealthConfigValidate(t *testing.T) {
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), ConsumerGroup: "g", Start: valkeystream.StartNew,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		config valkeystream.HealthConfig
		want   string
	}{
		{"no subscribers", valkeystream.HealthConfig{}, "HealthConfig.Subscribers is empty"},
		{"nil subscriber", valkeystream.HealthConfig{Subscribers: []*valkeystream.Subscriber{nil}}, "nil Subscriber"},
		{"negative", valkeystream.HealthConfig{Subscribers: []*valkeystream.Subscriber{sub}, FailingFor: -1}, "HealthConfig.FailingFor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := valkeystream.NewHealthCheck(tc.config)
			if !errors.Is(err, valkeystream.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an ErrInvalidConfig naming %q", err, tc.want)
			}
		})
	}
}
