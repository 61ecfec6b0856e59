package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/metrics"
)

// sideMetrics is valkeystream with a metrics.Collector registered and
// scraped all through the run: what the metrics cost, against the
// valkeystream side of the same scenario.
const sideMetrics = "valkeystream+metrics"

// metricsScrapeEvery is how often the metrics side gathers its registry,
// taking a sample of the server each time: 150 to 600 times as often as
// Prometheus would (15 s to 1 min), so that a cost shows if there is one.
const metricsScrapeEvery = 100 * time.Millisecond

var metricsSide = side{
	name:       sideMetrics,
	publisher:  newMetricsPublisher,
	fill:       fillValkeystream,
	subscriber: newMetricsSubscriber,
}

// scrapedCollector makes a Collector that samples the server through its
// own client, registers it in a new registry and gathers that every
// metricsScrapeEvery until the scope closes. Closing the scope reports the
// first failed gather.
func scrapedCollector(sc *scope) (*metrics.Collector, error) {
	c, err := metrics.NewCollector(metrics.Config{Client: sc.client(), SampleInterval: metricsScrapeEvery})
	if err != nil {
		return nil, fmt.Errorf("creating the collector: %w", err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("registering the collector: %w", err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var gatherErr error
	wg.Go(func() {
		t := time.NewTicker(metricsScrapeEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := reg.Gather(); err != nil && gatherErr == nil {
					gatherErr = err
				}
			}
		}
	})
	// Registered first, so that it runs last: the scrapes go on until the
	// Subscriber and Publisher are closed.
	sc.onClose("metrics scraper", func() error {
		close(stop)
		wg.Wait()
		if gatherErr != nil {
			return fmt.Errorf("gathering the metrics: %w", gatherErr)
		}
		return nil
	})
	return c, nil
}

func newMetricsPublisher(sc *scope) (message.Publisher, error) {
	c, err := scrapedCollector(sc)
	if err != nil {
		return nil, err
	}
	pub, err := newValkeystreamPublisher(sc)
	if err != nil {
		return nil, err
	}
	if err := c.AddPublisher("bench", pub.(*valkeystream.Publisher)); err != nil {
		return nil, err
	}
	return pub, nil
}

func newMetricsSubscriber(sc *scope, client *redis.Client) (message.Subscriber, error) {
	coll, err := scrapedCollector(sc)
	if err != nil {
		return nil, err
	}
	sub, err := newValkeystreamSubscriber(sc, client)
	if err != nil {
		return nil, err
	}
	vs, ok := sub.(*valkeystream.Subscriber)
	if !ok {
		return nil, errors.New("the valkeystream side did not return a *valkeystream.Subscriber")
	}
	if err := coll.AddSubscriber("bench", vs); err != nil {
		return nil, err
	}
	return sub, nil
}

// writeMetricsCost reports, for each scenario with the metrics side, its
// rate over the plain valkeystream side's: the median of the two medians,
// and the spread of the ratios of the runs of one repetition (the two sides
// run one after the other in each).
func (r report) writeMetricsCost(w *strings.Builder) {
	var rows []string
	for _, scn := range r.scenarios {
		if !slices.Contains(scn.sides, sideMetrics) || !slices.Contains(scn.sides, sideValkeystream) {
			continue
		}
		for _, size := range r.cfg.sizes {
			// At loopback, where the adapter's own cost shows most.
			without := r.res.samples[key{scn.id, sideValkeystream, size, 0}]
			with := r.res.samples[key{scn.id, sideMetrics, size, 0}]
			if len(without) == 0 || len(with) == 0 {
				continue
			}
			plain, _ := r.res.medianRate(key{scn.id, sideValkeystream, size, 0})
			scraped, _ := r.res.medianRate(key{scn.id, sideMetrics, size, 0})
			paired := make([]float64, min(len(without), len(with)))
			for i := range paired {
				paired[i] = ratio(with[i].rate(), without[i].rate())
			}
			rows = append(rows, fmt.Sprintf("| %s | %d B | %s | %s | **%s** | %s | %s to %s |",
				scn.title, size, formatRate(plain), formatRate(scraped), formatRatio(ratio(scraped, plain)),
				formatRatio(median(paired)), formatRatio(slices.Min(paired)), formatRatio(slices.Max(paired))))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Cost of metrics\n\nThe same scenario without metrics, and with a `metrics.Collector`\n"+
		"registered (the Publisher, or the Subscriber) and its registry gathered\n"+
		"every %s, each time with a sample of the server: far more often than\n"+
		"Prometheus scrapes. The ratio is the rate with metrics over the rate\n"+
		"without (1.00: no cost); the paired ratios divide the two runs of each\n"+
		"repetition, which ran one after the other, and show the noise.\n\n", metricsScrapeEvery)
	w.WriteString("| scenario | payload | without metrics | with metrics | ratio | median paired ratio | paired ratios |\n")
	w.WriteString("|---|---:|---:|---:|---:|---:|---|\n")
	w.WriteString(strings.Join(rows, "\n") + "\n\n")
}
