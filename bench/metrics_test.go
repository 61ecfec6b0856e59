package main

import (
	"strings"
	"testing"
)

// In testReport the metrics side takes twice as long as valkeystream in
// every run, so every ratio is 0.50.
func TestMetricsCost(t *testing.T) {
	md := testReport(t).markdown("")
	for _, want := range []string{
		"### Cost of metrics",
		"| publish, 64 goroutines, metrics scraped | 64 B | 100,000 | 50,000 | **0.50×** | 0.50× | 0.50× to 0.50× |",
		"| consume, channel + Ack, metrics scraped | 16 B | 100,000 | 50,000 | **0.50×** | 0.50× | 0.50× to 0.50× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(md, "| publish, 64 goroutines, metrics scraped | 64 B | 100,000 | – |") {
		t.Error("the throughput table lists a metrics scenario")
	}
}
