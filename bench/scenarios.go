package main

import (
	"fmt"
	"slices"
	"strings"
)

// A scenario is one measurement, taken for each of its sides at each
// payload size.
type scenario struct {
	id    string // as given to -scenarios
	title string // as the report and the chart name it
	sides []string
	kind  scenarioKind

	publish    bool
	goroutines int // publish: goroutines calling Publish at once
	perCall    int // publish: messages per Publish call

	router bool // consume: through a message.Router, else from the channel
	nack   bool // consume: Nack the first delivery of one message in 100

	// transform: through a router whose handler returns one output per
	// input, published to an output topic (the side's transform setup)
	transform bool

	// scale: through a router per subscription, else from the channel
	scaleRouter bool
}

// A scenarioKind says what a scenario measures and how it is reported.
type scenarioKind int

const (
	// kindThroughput: messages per second, for each payload of -sizes.
	kindThroughput scenarioKind = iota
	// kindLatency: publish to handler at fixed rates, through a router.
	kindLatency
	// kindLarge: consume large payloads through a router in a child
	// process, with its peak RSS.
	kindLarge
	// kindTopics: many topics on one Subscriber and one default client.
	kindTopics
	// kindScale: a partitioned topic with a slow handler, at each count of
	// subscriptions of -partition-subscriptions.
	kindScale
)

// sizes returns the payload sizes the scenario runs at: -sizes and
// -distance-sizes for throughput, -large-sizes for large payloads, none otherwise (those pick
// their own).
func (scn scenario) sizes(cfg config) []int {
	switch scn.kind {
	case kindThroughput:
		return cfg.allSizes()
	case kindLarge:
		return cfg.largeSizes
	default:
		return nil
	}
}

// scenarios, in the order they run and are reported.
var scenarios = []scenario{
	{
		id: "publish-concurrent", title: "publish, 64 goroutines, 1 msg/call",
		sides:   []string{sideValkeystream, sideIncumbent, sideRaw},
		publish: true, goroutines: 64, perCall: 1,
	},
	{
		id: "publish-single", title: "publish, 1 goroutine, 1 msg/call",
		sides:   []string{sideValkeystream, sideIncumbent, sideRaw},
		publish: true, goroutines: 1, perCall: 1,
	},
	{
		id: "publish-batch", title: "publish, 1 goroutine, 100 msgs/call",
		sides:   []string{sideValkeystream, sideIncumbent, sideRaw},
		publish: true, goroutines: 1, perCall: 100,
	},
	{
		id: "consume-router", title: "consume, router handler",
		sides:  []string{sideValkeystream, sideIncumbent, sideGoChannel},
		router: true,
	},
	{
		id: "consume-channel", title: "consume, channel + Ack",
		sides: []string{sideValkeystream, sideIncumbent, sideRaw},
	},
	{
		id: "consume-nack", title: "consume, channel, 1% Nacked once",
		sides: []string{sideValkeystream, sideIncumbent},
		nack:  true,
	},
	{
		id: "transform-router", title: "transform, router, 1 output per input",
		sides:     []string{sideValkeystream, sideExactlyOnce, sideExactlyOnceState, sideIncumbent},
		transform: true,
	},
	{
		id: "latency", title: "end-to-end latency, router",
		sides: []string{sideValkeystream, sideIncumbent, sideGoChannel},
		kind:  kindLatency,
	},
	{
		id: "consume-large", title: "consume large payloads, router",
		sides: []string{sideValkeystream, sideIncumbent},
		kind:  kindLarge,
	},
	{
		id: "many-topics", title: "many topics, one Subscriber, router",
		sides: []string{sideValkeystream, sideIncumbent},
		kind:  kindTopics,
	},
	{
		id: "publish-idempotent", title: "publish, 64 goroutines, 1 msg/call, idempotent",
		sides:   []string{sideValkeystream, sideIdempotent, sideIdempotentScript},
		publish: true, goroutines: 64, perCall: 1,
	},
	{
		id: "publish-idempotent-single", title: "publish, 1 goroutine, 1 msg/call, idempotent",
		sides:   []string{sideValkeystream, sideIdempotent, sideIdempotentScript},
		publish: true, goroutines: 1, perCall: 1,
	},
	{
		id: "metrics-publish", title: "publish, 64 goroutines, metrics scraped",
		sides:   []string{sideValkeystream, sideMetrics},
		publish: true, goroutines: 64, perCall: 1,
	},
	{
		id: "metrics-consume", title: "consume, channel + Ack, metrics scraped",
		sides: []string{sideValkeystream, sideMetrics},
	},
	{
		id: "partition-cost", title: "consume, router, partitioned topic",
		sides:  []string{sideValkeystream, sidePartitions1, sidePartitions8},
		router: true,
	},
	{
		id: "partition-scale-router", title: "partitioned topic, 1 ms handler, router per subscription",
		sides: []string{sideValkeystream},
		kind:  kindScale, scaleRouter: true,
	},
	{
		id: "partition-scale-channel", title: "partitioned topic, 1 ms handler, channel per subscription",
		sides: []string{sideValkeystream},
		kind:  kindScale,
	},
}

// reference returns the name of the scenario's reference side, or "".
func (scn scenario) reference() string {
	for _, name := range scn.sides {
		if sides[name].reference {
			return name
		}
	}
	return ""
}

// memoryScenario is the id of the memory scenario, which runs once, for
// valkeystream only, after the others.
const memoryScenario = "memory"

// selectScenarios returns the scenarios named in list (comma-separated ids;
// "all" or empty for every one) and whether the memory scenario is among
// them.
func selectScenarios(list string) ([]scenario, bool, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "all" {
		return scenarios, true, nil
	}
	var picked []scenario
	memory := false
	for _, id := range strings.Split(list, ",") {
		id = strings.TrimSpace(id)
		if id == memoryScenario {
			memory = true
			continue
		}
		found := false
		for _, sc := range scenarios {
			if sc.id == id {
				picked = append(picked, sc)
				found = true
			}
		}
		if !found {
			return nil, false, fmt.Errorf("unknown scenario %q; known: %s", id, scenarioIDs())
		}
	}
	return picked, memory, nil
}

func scenarioIDs() string {
	ids := make([]string, 0, len(scenarios)+1)
	for _, sc := range scenarios {
		ids = append(ids, sc.id)
	}
	return strings.Join(append(ids, memoryScenario), ", ")
}

// rotate returns xs rotated left by k, so that every side leads in some
// repetition and none always runs on a warmer or cooler machine.
func rotate[T any](xs []T, k int) []T {
	if len(xs) == 0 {
		return nil
	}
	k %= len(xs)
	return append(append([]T(nil), xs[k:]...), xs[:k]...)
}

// selectSides keeps only the sides named in list (comma-separated; empty
// for all) in each scenario. The memory scenario runs valkeystream
// regardless.
func selectSides(picked []scenario, list string) ([]scenario, error) {
	if strings.TrimSpace(list) == "" {
		return picked, nil
	}
	keep := map[string]bool{}
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if _, ok := sides[name]; !ok {
			return nil, fmt.Errorf("unknown side %q; known: %s", name, strings.Join(chartSides, ", "))
		}
		keep[name] = true
	}
	out := make([]scenario, 0, len(picked))
	for _, scn := range picked {
		scn.sides = slices.DeleteFunc(slices.Clone(scn.sides), func(name string) bool { return !keep[name] })
		out = append(out, scn)
	}
	return out, nil
}
