package valkeystream

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/echomq/valkeystream/internal/serverinfo"
)

// publishVerbs is what a Publisher knows of its server's newer verbs, for
// the two features that depend on them: idempotent publishing (XADD ...
// IDMP) and trimming that keeps unacknowledged entries (XADD ... ACKED).
type publishVerbs struct {
	known *serverinfo.Known

	mu        sync.Mutex
	name      string          // Verbs.String() of the last answer; "" before any
	unguarded map[string]bool // topics whose trimming was logged as unguarded
}

// verbsNeeded reports whether a Publish with this retention needs to know the
// verbs: with idempotency on, or trimming that should keep unacknowledged
// entries.
func (p *Publisher) verbsNeeded(trim bool, r Retention) bool {
	return p.config.IdempotentWindow > 0 || (trim && !r.DropUnacknowledged)
}

// serverVerbs returns the verbs of the Publisher's server, finding them out
// the first time and after a failover-ish failure, and logs the answer at
// Info when it is the first or differs from the one before.
func (p *Publisher) serverVerbs(ctx context.Context) (serverinfo.Verbs, error) {
	v, changed, refused, err := p.verbs.known.Verbs(ctx)
	if err != nil {
		return v, fmt.Errorf("finding out which stream verbs the server has: %w", err)
	}
	name := v.String()
	p.verbs.mu.Lock()
	first := p.verbs.name == ""
	if changed || first {
		p.verbs.name = name
	}
	p.verbs.mu.Unlock()
	if !changed && !first {
		return v, nil
	}
	fields := watermill.LogFields{"verbs": name, "idempotent_publish": "off", "acked_trim": v.AckedTrim}
	if p.config.IdempotentWindow > 0 {
		fields["idempotent_publish"] = "script"
		if v.IdempotentAdd {
			fields["idempotent_publish"] = "xadd-idmp"
		}
	}
	if refused != "" {
		fields["refused"] = refused
	}
	if p.config.BaselineVerbs {
		fields["baseline_verbs"] = true
	}
	p.logger.Info("Publisher uses these stream verbs of the server", fields)
	return v, nil
}

// trimMode returns the trimming mode of topic's XADDs: "ACKED" where the
// server keeps unacknowledged entries and the retention asks it to, else
// "" (plain trimming), which is logged once per topic unless the retention
// says it is meant.
func (p *Publisher) trimMode(topic string, r Retention, v serverinfo.Verbs) string {
	if r.DropUnacknowledged {
		return ""
	}
	if v.AckedTrim {
		return "ACKED"
	}
	p.verbs.mu.Lock()
	logged := p.verbs.unguarded[topic]
	if !logged {
		if p.verbs.unguarded == nil {
			p.verbs.unguarded = make(map[string]bool)
		}
		p.verbs.unguarded[topic] = true
	}
	p.verbs.mu.Unlock()
	if !logged {
		why := "this server has no XADD ... ACKED trimming (it needs Redis 8.2.7, 8.4.4, or 8.6 and later)"
		if p.config.BaselineVerbs {
			why = "BaselineVerbs is set"
		}
		p.logger.Info("Retention trims this topic's stream whether or not consumer groups acknowledged the entries, "+
			"so a lagging group can lose entries: "+why+"; keep retention well above the largest backlog, "+
			"or set Retention.DropUnacknowledged to say this is meant", watermill.LogFields{"topic": topic})
	}
	return ""
}

// forgetServer makes the next Publish that needs the verbs find them out again,
// and apply the idempotency window again: after a failover the client may
// reach another node, of another version.
func (p *Publisher) forgetServer() {
	p.verbs.known.Forget()
	p.idempotency.forget()
}

// last returns Verbs.String() of the last answer, or "" before any.
func (v *publishVerbs) last() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.name
}
