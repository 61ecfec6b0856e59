package loop

import (
	"testing"
	"time"
)

func TestFetchPlan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const beat = 5 * time.Second
	type check struct {
		do   func(p *fetchPlan)
		at   time.Duration // since t0
		want step
		from string // the drain or claim cursor the step uses, when it has one
	}
	tests := []struct {
		name   string
		every  time.Duration
		checks []check
	}{
		{"a start drains, then claims, then reads", beat, []check{
			{at: 0, want: stepDrain, from: "0"},
			{do: func(p *fetchPlan) { p.drained("5-0") }, want: stepDrain, from: "5-0"},
			{do: func(p *fetchPlan) { p.drained("") }, want: stepClaim, from: "0-0"},
			{do: func(p *fetchPlan) { p.claimed("0-0", 0, t0) }, want: stepRead},
			{at: beat - time.Millisecond, want: stepRead},
			{at: beat, want: stepClaim, from: "0-0"},
		}},
		{"a claim cursor other than 0-0 claims again at once", beat, []check{
			{do: func(p *fetchPlan) { p.drained("") }, want: stepClaim},
			{do: func(p *fetchPlan) { p.claimed("7-0", 0, t0) }, want: stepClaim, from: "7-0"},
			{do: func(p *fetchPlan) { p.claimed("0-0", 0, t0) }, want: stepRead},
		}},
		{"bodiless claimed entries are listed before anything else", beat, []check{
			{do: func(p *fetchPlan) { p.drained("") }, want: stepClaim},
			{do: func(p *fetchPlan) { p.claimed("0-0", 2, t0) }, want: stepMissing, from: "-"},
			{do: func(p *fetchPlan) { p.listed("(3-0") }, want: stepMissing, from: "(3-0"},
			{do: func(p *fetchPlan) { p.listed("") }, want: stepRead},
		}},
		{"a fault drains again from the start", beat, []check{
			{do: func(p *fetchPlan) { p.drained(""); p.claimed("0-0", 0, t0) }, want: stepRead},
			{do: func(p *fetchPlan) { p.restart() }, want: stepDrain, from: "0"},
			{do: func(p *fetchPlan) { p.drained("") }, want: stepRead},
		}},
		{"a fault while listing missing bodies drains from the start", beat, []check{
			{do: func(p *fetchPlan) { p.drained(""); p.claimed("0-0", 1, t0); p.listed("(4-0") }, want: stepMissing, from: "(4-0"},
			{do: func(p *fetchPlan) { p.restart() }, want: stepDrain, from: "0"},
		}},
		{"no claim beat never claims", -1, []check{
			{do: func(p *fetchPlan) { p.drained("") }, want: stepRead},
			{at: 1000 * time.Hour, want: stepRead},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFetchPlan(tt.every)
			for i, c := range tt.checks {
				if c.do != nil {
					c.do(&p)
				}
				got := p.next(t0.Add(c.at))
				if got != c.want {
					t.Fatalf("check %d: next step is %d, want %d", i, got, c.want)
				}
				var from string
				switch got {
				case stepDrain:
					from = p.drainFrom
				case stepMissing:
					from = p.missingFrom
				case stepClaim:
					from = p.claimFrom
				}
				if c.from != "" && from != c.from {
					t.Fatalf("check %d: cursor is %q, want %q", i, from, c.from)
				}
				if got == stepMissing != p.mustFetch() {
					t.Fatalf("check %d: mustFetch is %v with step %d", i, p.mustFetch(), got)
				}
			}
		})
	}
}

// After a drain, ids up to the last one it delivered are seen; an id above
// it, or any id before a drain delivered anything, is not.
func TestPlanSeenAfterADrain(t *testing.T) {
	p := newFetchPlan(-1)
	if p.seen("1-0") {
		t.Fatal("seen before any drain")
	}
	p.drained("1700000000000-5")
	p.drained("1700000000000-12")
	p.drained("")
	for id, want := range map[string]bool{
		"1700000000000-5": true, "1700000000000-12": true, "1699999999999-99": true,
		"1700000000000-13": false, "1700000000001-0": false, "junk": false,
	} {
		if got := p.seen(id); got != want {
			t.Errorf("seen(%q) = %v, want %v", id, got, want)
		}
	}
	p.restart()
	if !p.seen("1700000000000-12") {
		t.Fatal("a restart forgot what the drain delivered")
	}
}
