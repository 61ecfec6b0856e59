package main

import (
	"encoding/xml"
	"fmt"
	"math"
	"slices"
	"strings"
)

// chartColors gives each side its bar colour: the adapters in colour, the
// references in grey.
var chartColors = map[string]string{
	sideValkeystream: "#1f6fb4",
	sideIncumbent:    "#e8833a",
	sideRaw:          "#8a8a8a",
	sideGoChannel:    "#c4c4c4",
	sideMetrics:      "#7fb3de",

	sideIdempotent:       "#2ca25f",
	sideIdempotentScript: "#99d8c9",
	sideExactlyOnce:      "#6a51a3",
	sideExactlyOnceState: "#9e9ac8",
	sidePartitions1:      "#08306b",
	sidePartitions8:      "#4292c6",
}

// chartLabels names the sides in the legend.
var chartLabels = map[string]string{
	sideValkeystream: "valkeystream",
	sideIncumbent:    "watermill-redisstream",
	sideRaw:          "go-redis alone",
	sideGoChannel:    "gochannel (in memory)",
	sideMetrics:      "valkeystream, metrics scraped",

	sideIdempotent:       "valkeystream, idempotent",
	sideIdempotentScript: "valkeystream, idempotent by script",
	sideExactlyOnce:      "valkeystream, exactly-once",
	sideExactlyOnceState: "valkeystream, exactly-once with 2 state writes",
	sidePartitions1:      "valkeystream, 1 partition",
	sidePartitions8:      "valkeystream, 8 partitions",
}

// chartSides is the order of the legend and of the bars within a group.
var chartSides = []string{sideValkeystream, sideMetrics, sideIdempotent, sideIdempotentScript, sideExactlyOnce, sideExactlyOnceState, sidePartitions1, sidePartitions8, sideIncumbent, sideRaw, sideGoChannel}

// chartSize is the payload size the chart shows: 64 bytes if measured, else
// the first size.
func (r report) chartSize() int {
	if slices.Contains(r.cfg.sizes, 64) || len(r.cfg.sizes) == 0 {
		return 64
	}
	return r.cfg.sizes[0]
}

// A barGroup is one scenario in the chart.
type barGroup struct {
	title string
	bars  []bar
}

type bar struct {
	side  string
	value float64
}

func (r report) chartGroups() []barGroup {
	size := r.chartSize()
	var groups []barGroup
	for _, scn := range r.scenarios {
		if scn.kind != kindThroughput {
			continue
		}
		for _, delay := range r.cfg.delays {
			g := barGroup{title: scn.title}
			if len(r.cfg.delays) > 1 {
				g.title += ", RTT " + r.rttCell(delay)
			}
			for _, name := range chartSides {
				if !slices.Contains(scn.sides, name) {
					continue
				}
				if v, ok := r.res.medianRate(key{scn.id, name, size, delay}); ok && v > 0 {
					g.bars = append(g.bars, bar{name, v})
				}
			}
			if len(g.bars) > 0 {
				groups = append(groups, g)
			}
		}
	}
	return groups
}

func (r report) chartSVG() string {
	title := fmt.Sprintf("Messages per second, %d-byte payloads, median of %s", r.chartSize(), plural(r.cfg.reps, "run"))
	if len(r.cfg.delays) == 1 {
		title += ", round trip " + r.rttCell(r.cfg.delays[0])
	}
	return barChartSVG(title, r.chartGroups())
}

// Chart geometry, in pixels.
const (
	chartWidth  = 900
	labelWidth  = 320 // scenario titles (with their round trip), left of the plot
	valueWidth  = 80  // room for the value right of the longest bar
	headHeight  = 64  // title and legend
	footHeight  = 36  // axis labels
	barHeight   = 14
	barGap      = 3
	groupGap    = 18
	chartMargin = 12
)

// barChartSVG draws grouped horizontal bars on a linear axis from zero, with
// the value written at the end of each bar.
func barChartSVG(title string, groups []barGroup) string {
	step, top := axisTicks(groups)
	plotLeft := float64(chartMargin + labelWidth)
	plotWidth := float64(chartWidth - 2*chartMargin - labelWidth - valueWidth)
	x := func(v float64) float64 { return plotLeft + plotWidth*v/top }
	plotHeight := 0
	for _, g := range groups {
		plotHeight += len(g.bars)*(barHeight+barGap) - barGap + groupGap
	}
	height := headHeight + plotHeight + footHeight

	var w strings.Builder
	fmt.Fprintf(&w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&w, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartWidth, height)
	fmt.Fprintf(&w, `<text x="%d" y="22" font-size="15" font-weight="bold" fill="#222">%s</text>`+"\n", chartMargin, escape(title))

	// Legend: the sides that appear, in chart order.
	lx := float64(chartMargin)
	for _, name := range chartSides {
		if !chartHasSide(groups, name) {
			continue
		}
		label := chartLabels[name]
		fmt.Fprintf(&w, `<rect x="%.1f" y="36" width="12" height="12" fill="%s"/>`+"\n", lx, chartColors[name])
		fmt.Fprintf(&w, `<text x="%.1f" y="46" fill="#222">%s</text>`+"\n", lx+17, escape(label))
		lx += 17 + 7*float64(len(label)) + 24
	}

	// Grid: a line and a label at each tick.
	gridTop, gridBottom := headHeight-4, headHeight+plotHeight-groupGap/2
	for v := 0.0; v <= top*1.0001; v += step {
		fmt.Fprintf(&w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#dddddd"/>`+"\n", x(v), gridTop, x(v), gridBottom)
		fmt.Fprintf(&w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x(v), gridBottom+16, axisLabel(v))
	}
	fmt.Fprintf(&w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">messages per second</text>`+"\n", plotLeft+plotWidth/2, gridBottom+31)

	y := headHeight
	for _, g := range groups {
		groupHeight := len(g.bars)*(barHeight+barGap) - barGap
		fmt.Fprintf(&w, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#222">%s</text>`+"\n",
			plotLeft-8, float64(y)+float64(groupHeight)/2+4, escape(g.title))
		for _, b := range g.bars {
			end := x(b.value)
			fmt.Fprintf(&w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %s msg/s</title></rect>`+"\n",
				plotLeft, y, max(end-plotLeft, 1), barHeight, chartColors[b.side], escape(chartLabels[b.side]), formatRate(b.value))
			fmt.Fprintf(&w, `<text x="%.1f" y="%d" font-size="11" fill="#333">%s</text>`+"\n", end+4, y+barHeight-3, formatRate(b.value))
			y += barHeight + barGap
		}
		y += groupGap - barGap
	}
	w.WriteString("</svg>\n")
	return w.String()
}

// axisTicks returns a tick step of 1, 2 or 5 times a power of ten that cuts
// the axis into at most eight parts, and the axis' end: the first tick at
// or above the largest value.
func axisTicks(groups []barGroup) (step, top float64) {
	largest := 0.0
	for _, g := range groups {
		for _, b := range g.bars {
			largest = max(largest, b.value)
		}
	}
	if largest <= 0 {
		return 1, 1
	}
	magnitude := math.Pow(10, math.Floor(math.Log10(largest/8)))
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * magnitude
		if largest/step <= 8 {
			break
		}
	}
	return step, math.Ceil(largest/step) * step
}

// axisLabel writes a tick value as 0, 50k, 1.5M, ...
func axisLabel(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%g", v)
	}
}

func chartHasSide(groups []barGroup, name string) bool {
	for _, g := range groups {
		for _, b := range g.bars {
			if b.side == name {
				return true
			}
		}
	}
	return false
}

func escape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
