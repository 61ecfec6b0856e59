package metrics_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/echomq/valkeystream/metrics"
)

// TestAlertRules checks rules.yml with Prometheus' own tool and runs its
// unit tests (rules_test.yml: each alert fed series that make it fire and
// series that must not). Without promtool (Debian: apt-get install
// prometheus) it skips, unless VALKEYSTREAM_REQUIRE_PROMTOOL is set, as CI
// sets it.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("VALKEYSTREAM_REQUIRE_PROMTOOL") != "" {
			t.Fatalf("VALKEYSTREAM_REQUIRE_PROMTOOL is set and promtool is not on PATH (apt-get install prometheus): %v", err)
		}
		t.Skip("promtool is not on PATH (apt-get install prometheus); the rules are checked by the CI, which has it")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// TestAlertRulesUseOnlyMetricsTheCollectorHas catches a metric renamed in
// the collector and not in rules.yml, which Prometheus would take for a
// series that never came.
func TestAlertRulesUseOnlyMetricsTheCollectorHas(t *testing.T) {
	rules, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := metrics.NewCollector(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var known []string
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			known = append(known, m[1])
		}
	}
	used := regexp.MustCompile(`\bvalkeystream_[a-z_]+`).FindAllString(string(rules), -1)
	if len(used) == 0 {
		t.Fatal("rules.yml names no valkeystream metric")
	}
	for _, name := range used {
		if !slices.Contains(known, name) {
			t.Errorf("rules.yml uses %s, which the Collector does not describe", name)
		}
	}
}
