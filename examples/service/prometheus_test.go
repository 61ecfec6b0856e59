package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/examples/internal/e2e"
)

// TestPrometheusFiresTheLagAlert runs a real Prometheus with the shipped
// rules (metrics/rules.yml, its time scales shortened) scraping a
// monitoring instance of the service (-handlers=false) while a working
// instance consumes; once the working instance stops, orders go on
// arriving, and the alerts fire, read through Prometheus' HTTP API: no
// consumer alive in its groups, and their lag growing (where the server
// reports a group's lag: not Redis 6.2, whose XINFO GROUPS has none).
// Without the prometheus binary (Debian: apt-get install prometheus) it
// skips, unless VALKEYSTREAM_REQUIRE_PROMTOOL is set, as CI sets it.
func TestPrometheusFiresTheLagAlert(t *testing.T) {
	t.Parallel() // beside TestService: each runs a server of its own
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("VALKEYSTREAM_REQUIRE_PROMTOOL") != "" {
			t.Fatalf("VALKEYSTREAM_REQUIRE_PROMTOOL is set and prometheus is not on PATH (apt-get install prometheus): %v", err)
		}
		t.Skip("prometheus is not on PATH (apt-get install prometheus); CI has it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "service")
	e2e.Build(ctx, t, bin, ".", e2e.RaceEnabled)
	srv := e2e.StartServer(ctx, t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })

	worker := startService(ctx, t, bin, srv.Addr, byFlags)
	mon := startService(ctx, t, bin, srv.Addr, byFlags, "-handlers=false", "-sample-interval", "200ms")
	prom := startPrometheus(ctx, t, promBin, strings.TrimPrefix(mon.url, "http://"), strings.TrimPrefix(worker.url, "http://"))
	waitFor(ctx, t, "Prometheus to scrape both instances", func() (bool, string) {
		v, detail := prom.query(ctx, t, `valkeystream:group_pending:max{stream="OrderPlaced",group="billing"}`)
		if v < 0 {
			return false, detail
		}
		v, detail = prom.query(ctx, t, `valkeystream:group_subscriptions:count{stream="OrderPlaced",group="billing"}`)
		return v == 1, detail
	})
	lagReported, _ := prom.query(ctx, t, `valkeystream:group_lag:max{stream="OrderPlaced",group="billing"}`)
	if firing, _ := prom.firing(ctx, t, "ValkeystreamNoConsumerAlive", map[string]string{"group": "billing"}); firing {
		t.Fatal("ValkeystreamNoConsumerAlive fires for billing while its subscription runs")
	}

	worker.stop(t)
	bus := testBus(t, client)
	// Orders arrive while nobody handles them, until the alerts fire.
	var placed int
	billing := map[string]string{"stream": "OrderPlaced", "group": "billing"}
	waitFor(ctx, t, "the alerts to fire for billing", func() (bool, string) {
		for range 10 {
			placed++
			if err := bus.Publish(ctx, &OrderPlaced{OrderID: fmt.Sprintf("p%04d", placed), Customer: "alice", Cents: 100}); err != nil {
				t.Fatal(err)
			}
		}
		if ok, detail := prom.firing(ctx, t, "ValkeystreamNoConsumerAlive", billing); !ok {
			return false, detail
		}
		if lagReported < 0 {
			return true, ""
		}
		return prom.firing(ctx, t, "ValkeystreamLagGrowing", billing)
	})
	if lagReported < 0 {
		t.Logf("ValkeystreamNoConsumerAlive fired for billing after %d orders nobody handled; the server reports no lag (%s), so ValkeystreamLagGrowing cannot", placed, srv.About)
		return
	}
	t.Logf("ValkeystreamNoConsumerAlive and ValkeystreamLagGrowing fired for billing after %d orders nobody handled", placed)
}

// promServer is a Prometheus process of a test.
type promServer struct{ url string }

// startPrometheus starts Prometheus scraping targets every 200 ms with the
// rules of metrics/rules.yml, their time scales shortened for a test: the
// lag alert's 10 minutes to 2 seconds and its backlog threshold to 20, the
// no-consumer alert's 2 minutes to 1 second.
func startPrometheus(ctx context.Context, t *testing.T, bin string, targets ...string) *promServer {
	t.Helper()
	rules, err := os.ReadFile("../../metrics/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(rules)
	for _, r := range [][2]string{
		{"valkeystream:group_backlog:max > 1000", "valkeystream:group_backlog:max > 20"},
		{"deriv(valkeystream:group_lag:max[10m])", "deriv(valkeystream:group_lag:max[3s])"},
		{"for: 10m", "for: 2s"},
		{`unless on (stream, group) valkeystream:group_subscriptions:count
        for: 2m`, `unless on (stream, group) valkeystream:group_subscriptions:count
        for: 1s`},
	} {
		if strings.Count(text, r[0]) != 1 {
			t.Fatalf("metrics/rules.yml holds %q %d times, want once: the test shortens it", r[0], strings.Count(text, r[0]))
		}
		text = strings.ReplaceAll(text, r[0], r[1])
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 200ms
  evaluation_interval: 200ms
rule_files: [rules.yml]
scrape_configs:
  - job_name: service
    static_configs: [{targets: [%s]}]
`, quoted(targets))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(e2e.FreePort(t))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	output := &e2e.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = output, output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", output.String())
		}
	})
	p := &promServer{url: "http://" + addr}
	waitFor(ctx, t, "Prometheus to be ready", func() (bool, string) {
		code, body := get(ctx, t, p.url+"/-/ready")
		return code == 200, fmt.Sprintf("/-/ready: %d %s", code, body)
	})
	return p
}

// query returns the value of the instant query expr's one series, or -1
// when it has none.
func (p *promServer) query(ctx context.Context, t *testing.T, expr string) (float64, string) {
	t.Helper()
	code, body := get(ctx, t, p.url+"/api/v1/query?query="+url.QueryEscape(expr))
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &r) != nil || len(r.Data.Result) != 1 {
		return -1, fmt.Sprintf("%s: %d %s", expr, code, body)
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return -1, body
	}
	return v, fmt.Sprintf("%s = %v", expr, v)
}

// firing reports whether Prometheus has the alert firing with labels.
func (p *promServer) firing(ctx context.Context, t *testing.T, alert string, labels map[string]string) (bool, string) {
	t.Helper()
	code, body := get(ctx, t, p.url+"/api/v1/alerts")
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &r) != nil {
		return false, fmt.Sprintf("/api/v1/alerts: %d %s", code, body)
	}
	for _, a := range r.Data.Alerts {
		if a.Labels["alertname"] != alert || a.State != "firing" {
			continue
		}
		match := true
		for k, v := range labels {
			match = match && a.Labels[k] == v
		}
		if match {
			return true, ""
		}
	}
	return false, "alerts: " + body
}

// quoted returns ss quoted and comma-separated, for a YAML list.
func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}
