package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/echomq/valkeystream"
)

// The idempotent-publishing sides: valkeystream with
// PublisherConfig.IdempotentWindow, on the server's own path (XADD ...
// IDMP on Redis 8.6 and later, else the script) and on the script path
// (BaselineVerbs), to compare with the plain valkeystream side of the same
// scenario.
const (
	sideIdempotent       = "valkeystream+idempotent"
	sideIdempotentScript = "valkeystream+idempotent-script"
)

// benchIdempotentWindow is the window of the idempotent sides. Every run
// publishes to a new stream, so no run sees another's UUIDs.
const benchIdempotentWindow = time.Minute

var (
	idempotentSide = side{
		name:      sideIdempotent,
		publisher: func(sc *scope) (message.Publisher, error) { return newIdempotentPublisher(sc, false) },
	}
	idempotentScriptSide = side{
		name:      sideIdempotentScript,
		publisher: func(sc *scope) (message.Publisher, error) { return newIdempotentPublisher(sc, true) },
	}
)

func newIdempotentPublisher(sc *scope, baseline bool) (message.Publisher, error) {
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{
		Client: sc.client(), IdempotentWindow: benchIdempotentWindow, BaselineVerbs: baseline,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("creating the idempotent valkeystream publisher: %w", err)
	}
	sc.onClose("idempotent valkeystream publisher", pub.Close)
	return pub, nil
}

// isIdempotentScenario reports whether scn compares idempotent publishing
// with plain publishing.
func (scn scenario) isIdempotentScenario() bool {
	return slices.Contains(scn.sides, sideIdempotent) || slices.Contains(scn.sides, sideIdempotentScript)
}

// writeIdempotentCost reports, for each scenario with an idempotent side,
// the cost of idempotent publishing at each distance: the plain
// valkeystream side's rate over the idempotent side's (1.00: no cost; 1.20:
// a message costs 20% more time), from the medians, with the spread of the
// paired runs of each repetition.
func (r report) writeIdempotentCost(w *strings.Builder) {
	var rows []string
	for _, scn := range r.scenarios {
		if !scn.isIdempotentScenario() {
			continue
		}
		for _, size := range r.cfg.sizes {
			for _, delay := range r.cfg.delays {
				plainKey := key{scn.id, sideValkeystream, size, delay}
				plain, ok := r.res.medianRate(plainKey)
				if !ok {
					continue
				}
				for _, name := range []string{sideIdempotent, sideIdempotentScript} {
					k := key{scn.id, name, size, delay}
					rate, ok := r.res.medianRate(k)
					if !ok {
						continue
					}
					without, with := r.res.samples[plainKey], r.res.samples[k]
					paired := make([]float64, min(len(without), len(with)))
					for i := range paired {
						paired[i] = ratio(without[i].rate(), with[i].rate())
					}
					spread := "–"
					if len(paired) > 0 {
						spread = formatRatio(slices.Min(paired)) + " to " + formatRatio(slices.Max(paired))
					}
					rows = append(rows, fmt.Sprintf("| %s | %d B | %s | %s | %s | %s | **%s** | %s |",
						scn.title, size, r.rttCell(delay), name, formatRate(plain), formatRate(rate),
						formatRatio(ratio(plain, rate)), spread))
				}
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Cost of idempotent publishing\n\nThe same scenario with plain publishing and with `IdempotentWindow`\n"+
		"(%s): `%s` on the server's own path (`XADD ... IDMP` where the server\n"+
		"has it, else the script), `%s` on the script path (`BaselineVerbs`).\n"+
		"The cost is the plain rate over the idempotent rate (1.00: none; 1.20: a\n"+
		"message takes 20%% longer); the paired costs divide the runs of each\n"+
		"repetition, which ran one after the other, and show the noise.\n\n",
		benchIdempotentWindow, sideIdempotent, sideIdempotentScript)
	w.WriteString("| scenario | payload | round trip | side | plain | idempotent | cost | paired costs |\n")
	w.WriteString("|---|---:|---:|---|---:|---:|---:|---|\n")
	w.WriteString(strings.Join(rows, "\n") + "\n\n")
}
