//go:build stress

package valkeystream_test

import (
	"testing"
	"time"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestCrashAuditStress is the soak variant of TestCrashAudit: ten times the
// messages, more workers and more kills (go test -tags stress -run
// TestCrashAuditStress -timeout 30m .).
func TestCrashAuditStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	runCrashAudit(t, crashAuditParams{
		Messages:   200000,
		Workers:    5,
		Rounds:     200,
		KillEvery:  [2]time.Duration{100 * time.Millisecond, 600 * time.Millisecond},
		PublishFor: 60 * time.Second,
		Batch:      25,
	})
}

// TestServerCrashStress mixes the disruptions of the server-crash audits over
// one long stream: twelve server kills with outages up to 3 s, client kills
// and pauses, while 60 000 messages are published.
func TestServerCrashStress(t *testing.T) {
	testserver.Parallel(t) // beside the other tests: the invariants hold however much CPU the workers get
	srv := testserver.Start(t)
	if !srv.Restartable() {
		t.Skip("the server at VALKEYSTREAM_TEST_ADDR cannot be killed by the test: this audit needs a private server")
	}
	r := newServerCrashRun(t, srv, serverCrashOptions{messages: 60000, readTimeout: time.Second})
	var disruptions []serverDisruption
	for i := range 12 {
		outage := []time.Duration{100 * time.Millisecond, 700 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second}[i%4]
		disruptions = append(disruptions, serverKill(srv, outage), r.clientKill(i%2 == 0))
		if i%4 == 3 {
			disruptions = append(disruptions, r.clientPause([]string{"ALL", "WRITE"}[i/4%2]))
		}
	}
	r.run(disruptions)
}
