//go:build chart

package metrics_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
	"github.com/echomq/valkeystream/metrics"
)

var chartOut = flag.String("chart.out", "../docs/metrics-outage.svg", "where TestChart writes the SVG")

// point is one recorded scrape.
type point struct {
	at                  float64 // seconds since the start
	lag, pending, stale float64 // stale: oldest pending age in seconds
}

// TestChart records lag, pending and the oldest pending age of a group
// whose handler hangs for a while and then recovers, while publishing goes
// on, and draws them as the SVG in docs/metrics.md.
func TestChart(t *testing.T) {
	const (
		publishEvery = 5 * time.Millisecond // 200 messages a second
		stuckFrom    = 6 * time.Second
		stuckUntil   = 18 * time.Second
		handleTime   = 2 * time.Millisecond
		recordEvery  = 100 * time.Millisecond
		maxRun       = 60 * time.Second
	)
	srv := testserver.Start(t)
	client := newClient(t, srv)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "billing", Start: valkeystream.StartHead,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c, err := metrics.NewCollector(metrics.Config{Client: client, SampleInterval: recordEvery / 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddSubscriber("billing", sub); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var stuck atomic.Bool
	unstuck := make(chan struct{})
	go func() { // the handler
		for m := range msgs {
			if stuck.Load() {
				<-unstuck
			}
			time.Sleep(handleTime) // the time is the scenario: the handler's work
			m.Ack()
		}
	}()
	var publishing atomic.Bool
	publishing.Store(true)
	go func() { // the publisher
		tick := time.NewTicker(publishEvery)
		defer tick.Stop()
		for range tick.C {
			if !publishing.Load() || ctx.Err() != nil {
				return
			}
			_ = pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("order")))
		}
	}()

	var points []point
	tick := time.NewTicker(recordEvery)
	defer tick.Stop()
	caughtUp := time.Duration(0)
	for range tick.C {
		now := time.Since(start)
		switch {
		case now >= stuckFrom && now < stuckUntil && !stuck.Load():
			stuck.Store(true)
		case now >= stuckUntil && stuck.Load():
			stuck.Store(false)
			close(unstuck)
		}
		g := gatherChart(t, reg)
		points = append(points, point{at: now.Seconds(), lag: g["valkeystream_group_lag"], pending: g["valkeystream_group_pending"],
			stale: g["valkeystream_group_oldest_pending_age_seconds"]})
		last := points[len(points)-1]
		if now > stuckUntil && last.lag == 0 && caughtUp == 0 {
			caughtUp = now
		}
		if caughtUp > 0 && now > caughtUp+4*time.Second || now > maxRun {
			break
		}
	}
	publishing.Store(false)
	if caughtUp == 0 {
		t.Fatalf("the group did not catch up within %s", maxRun)
	}
	svg := drawChart(points, stuckFrom.Seconds(), stuckUntil.Seconds(), srv.Name()+" "+srv.Version())
	if err := os.WriteFile(*chartOut, []byte(svg), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d points, caught up %.1fs after the handler recovered", *chartOut, len(points), (caughtUp - stuckUntil).Seconds())
}

// gatherChart returns the value of each metric of the single group.
func gatherChart(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			out[f.GetName()] = value(m)
		}
	}
	return out
}

// drawChart draws two panels over time: lag and pending in entries, and
// the oldest pending age in seconds, with the stuck period shaded.
func drawChart(points []point, stuckFrom, stuckUntil float64, server string) string {
	const (
		width, height = 760.0, 440.0
		left, right   = 64.0, 24.0
		top1, h1      = 48.0, 190.0
		top2, h2      = 290.0, 100.0
		lagColor      = "#1f77b4"
		pendingColor  = "#ff7f0e"
		ageColor      = "#d62728"
		gridColor     = "#e5e5e5"
		stuckShade    = "#f3e5e5"
		font          = `font-family="sans-serif" font-size="12"`
	)
	tMax := points[len(points)-1].at
	var yMax1, yMax2 float64
	for _, p := range points {
		yMax1 = max(yMax1, p.lag, p.pending)
		yMax2 = max(yMax2, p.stale)
	}
	yMax1, step1 := niceScale(yMax1)
	yMax2, step2 := niceScale(yMax2)
	plotW := width - left - right
	x := func(t float64) float64 { return left + t/tMax*plotW }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-family="sans-serif" font-size="14" font-weight="bold">A handler hangs from %.0fs to %.0fs while 200 messages/s are published</text>`+"\n", left, stuckFrom, stuckUntil)
	fmt.Fprintf(&b, `<text x="%.0f" y="38" %s fill="#555">valkeystream metrics scraped every 100 ms, %s</text>`+"\n", left, font, server)

	panel := func(top, h, yMax, step float64, unit string, series []struct {
		color, name string
		get         func(point) float64
	}) {
		y := func(v float64) float64 { return top + h - v/yMax*h }
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x(stuckFrom), top, x(stuckUntil)-x(stuckFrom), h, stuckShade)
		for v := 0.0; v <= yMax+step/2; v += step {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", left, y(v), width-right, y(v), gridColor)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" %s text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, font, formatTick(v))
		}
		fmt.Fprintf(&b, `<text x="14" y="%.1f" %s transform="rotate(-90 14 %.1f)" text-anchor="middle">%s</text>`+"\n", top+h/2, font, top+h/2, unit)
		for i, s := range series {
			var pts []string
			for _, p := range points {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.at), y(s.get(p))))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
			lx := left + 12 + float64(i)*230
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", lx, top+12, lx+18, top+12, s.color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" %s>%s</text>`+"\n", lx+24, top+16, font, s.name)
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`+"\n", left, top, plotW, h)
	}
	panel(top1, h1, yMax1, step1, "entries", []struct {
		color, name string
		get         func(point) float64
	}{
		{lagColor, "valkeystream_group_lag", func(p point) float64 { return p.lag }},
		{pendingColor, "valkeystream_group_pending", func(p point) float64 { return p.pending }},
	})
	panel(top2, h2, yMax2, step2, "seconds", []struct {
		color, name string
		get         func(point) float64
	}{
		{ageColor, "valkeystream_group_oldest_pending_age_seconds", func(p point) float64 { return p.stale }},
	})
	for s := 0.0; s <= tMax; s += 5 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" %s text-anchor="middle">%.0fs</text>`+"\n", x(s), top2+h2+18, font, s)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" %s fill="#a33" text-anchor="middle">handler stuck</text>`+"\n", (x(stuckFrom)+x(stuckUntil))/2, top1+h1+18, font)
	b.WriteString("</svg>\n")
	return b.String()
}

// niceScale returns an axis maximum at or above v and a tick step.
func niceScale(v float64) (maxV, step float64) {
	if v <= 0 {
		return 1, 1
	}
	raw := v / 4
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}

func formatTick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
