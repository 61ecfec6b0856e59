package serverinfo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Verbs are the stream verbs newer than Redis 6.2's that a server has and
// the library uses where it finds them. The zero value is the baseline path:
// what every supported server has.
type Verbs struct {
	// ClaimInRead: XREADGROUP ... CLAIM min-idle-time (Redis 8.4): a read
	// of new entries brings idle pending entries first, each with its
	// delivery count.
	ClaimInRead bool
	// IdempotentAdd: XADD ... IDMP producer id and XCFGSET (Redis 8.6).
	IdempotentAdd bool
	// AckedTrim: XADD ... ACKED MAXLEN|MINID ~ (Redis 8.2), trimming only
	// entries every group acknowledged, on a release whose approximate
	// form trims at all (8.2.7, 8.4.4, 8.6.0 and later).
	AckedTrim bool
	// AckDel: XACKDEL key group ACKED IDS ... (Redis 8.2, Valkey 9.2).
	AckDel bool
}

// String names the path: the verbs in use, or "baseline".
func (v Verbs) String() string {
	var names []string
	for _, n := range []struct {
		on   bool
		name string
	}{{v.ClaimInRead, "claim-in-read"}, {v.IdempotentAdd, "idempotent-add"}, {v.AckedTrim, "acked-trim"}, {v.AckDel, "ackdel"}} {
		if n.on {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "baseline"
	}
	return strings.Join(names, ",")
}

// Probe finds out which verbs the server behind client has, from COMMAND
// DOCS (the arguments a command takes, which a version string cannot tell:
// Valkey reports 7.2-compatible versions), and for ACKED trimming from
// INFO's version as well (releases before 8.2.7 and 8.4.4 accept approximate
// ACKED trimming and trim nothing).
//
// A server that refuses a probe (Redis 6.2 has no COMMAND DOCS; a user may
// lack the permission) has the baseline: refused then names the refused
// command, and err is nil. err is a failed call (a connection error, say):
// nothing was found out.
//
// On a cluster (or a ring) every master (shard) is asked, and a verb counts
// only if each has it: during a rolling upgrade a topic's slot may live on
// a node that has not been upgraded yet.
func Probe(ctx context.Context, client redis.UniversalClient) (v Verbs, refused string, err error) {
	var nodes func(context.Context, func(context.Context, *redis.Client) error) error
	switch c := client.(type) {
	case *redis.ClusterClient:
		nodes = c.ForEachMaster
	case *redis.Ring:
		nodes = c.ForEachShard
	default:
		return probeOne(ctx, client)
	}
	var mu sync.Mutex
	first := true
	err = nodes(ctx, func(ctx context.Context, node *redis.Client) error {
		nv, nrefused, nerr := probeOne(ctx, node)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case nerr != nil:
			return nerr
		case first:
			v, first = nv, false
		default:
			v = v.and(nv)
		}
		if nrefused != "" {
			refused = nrefused
		}
		return nil
	})
	if err != nil {
		return Verbs{}, "", err
	}
	return v, refused, nil
}

// and returns the verbs both v and w have.
func (v Verbs) and(w Verbs) Verbs {
	return Verbs{
		ClaimInRead:   v.ClaimInRead && w.ClaimInRead,
		IdempotentAdd: v.IdempotentAdd && w.IdempotentAdd,
		AckedTrim:     v.AckedTrim && w.AckedTrim,
		AckDel:        v.AckDel && w.AckDel,
	}
}

// probeOne is Probe of one node.
func probeOne(ctx context.Context, client redis.UniversalClient) (Verbs, string, error) {
	docs := DocsCommand(ctx)
	_ = client.Process(ctx, docs)
	return fromDocs(ctx, client, docs)
}

// DocsCommand returns the COMMAND DOCS call of Probe, for a caller to send
// in a pipeline of its own and hand to Known.Learn.
func DocsCommand(ctx context.Context) *redis.Cmd {
	return redis.NewCmd(ctx, "COMMAND", "DOCS", "xreadgroup", "xadd", "xackdel")
}

// fromDocs is Probe's answer from the reply of DocsCommand.
func fromDocs(ctx context.Context, client redis.UniversalClient, docsCmd *redis.Cmd) (v Verbs, refused string, err error) {
	docs, err := docsCmd.Result()
	if err != nil {
		if isReply(err) {
			return Verbs{}, fmt.Sprintf("COMMAND DOCS (%v)", err), nil
		}
		return Verbs{}, "", fmt.Errorf("asking the server which stream verbs it has (COMMAND DOCS): %w", err)
	}
	byName := commandDocs(docs)
	v.ClaimInRead = hasToken(byName["xreadgroup"], "claim")
	v.IdempotentAdd = hasToken(byName["xadd"], "idmp")
	v.AckDel = byName["xackdel"] != nil
	if hasToken(byName["xadd"], "acked") {
		if v.IdempotentAdd {
			v.AckedTrim = true // 8.6 and later: fixed in 8.6.0
		} else {
			info, ierr := client.Info(ctx, "server").Result()
			switch {
			case ierr == nil:
				v.AckedTrim = ackedTrimWorks(info)
			case isReply(ierr):
				return v, fmt.Sprintf("INFO server (%v), needed to tell whether this Redis 8.2 or 8.4 trims with ACKED", ierr), nil
			default:
				return Verbs{}, "", fmt.Errorf("reading the server's version (INFO server): %w", ierr)
			}
		}
	}
	return v, "", nil
}

// RefusedVerb reports whether err is a server's refusal of a command or an
// argument it does not know: what a newer verb meets on an older node (a
// failover, or a rolling upgrade, put the client there), after which the
// verbs must be found out again (Known.Forget).
func RefusedVerb(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := strings.ToLower(reply.Error())
	// XADD reads an option it does not know (IDMP, ACKED) as the entry id.
	for _, s := range []string{"syntax error", "unknown command", "unknown subcommand", "unknown option", "unrecognized",
		"wrong number of arguments", "invalid stream id specified"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// commandDocs returns the docs of each command in a COMMAND DOCS reply, a
// map in RESP3 and a flat list of names and docs in RESP2. A command the
// server lacks is absent.
func commandDocs(reply any) map[string]any {
	out := map[string]any{}
	switch r := reply.(type) {
	case map[any]any:
		for k, v := range r {
			if name, ok := k.(string); ok {
				out[strings.ToLower(name)] = v
			}
		}
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			if name, ok := r[i].(string); ok {
				out[strings.ToLower(name)] = r[i+1]
			}
		}
	}
	return out
}

// hasToken reports whether a command's docs name an argument token (or
// argument) named like name, at any depth.
func hasToken(docs any, name string) bool {
	switch d := docs.(type) {
	case map[any]any:
		for k, v := range d {
			if key, _ := k.(string); key == "token" || key == "name" {
				if s, ok := v.(string); ok && strings.EqualFold(s, name) {
					return true
				}
			}
			if hasToken(v, name) {
				return true
			}
		}
	case []any:
		for i, v := range d {
			// RESP2: a map comes as a flat list of keys and values.
			if key, ok := v.(string); ok && (key == "token" || key == "name") && i+1 < len(d) {
				if s, ok := d[i+1].(string); ok && strings.EqualFold(s, name) {
					return true
				}
			}
			if hasToken(v, name) {
				return true
			}
		}
	}
	return false
}

// ackedTrimWorks reports whether a Redis whose INFO server reply is info
// trims with approximate ACKED: 8.2.7 and later in 8.2, 8.4.4 and later in
// 8.4, any later series.
func ackedTrimWorks(info string) bool {
	_, rest, found := strings.Cut(info, "redis_version:")
	if !found {
		return false
	}
	version, _, _ := strings.Cut(rest, "\n")
	parts := strings.SplitN(strings.TrimSpace(version), ".", 3)
	if len(parts) < 3 {
		return false
	}
	var n [3]int
	for i, p := range parts {
		n[i], _ = strconv.Atoi(p)
	}
	switch {
	case n[0] != 8:
		return n[0] > 8
	case n[1] == 2:
		return n[2] >= 7
	case n[1] == 4:
		return n[2] >= 4
	default:
		return n[1] > 4
	}
}

// Known is what one client's server has, found out on first use and again
// after a failover may have moved the client to another node. It is safe
// for concurrent use.
type Known struct {
	client   redis.UniversalClient
	baseline bool // the user forced the baseline path

	// probing serializes probes; what they found is read without it, so
	// that no reader waits behind a probe the network holds up.
	probing sync.Mutex
	state   atomic.Pointer[knownState] // nil before the first answer
}

// knownState is what a Known knows, replaced whole.
type knownState struct {
	verbs Verbs
	known bool // verbs holds the answer for the current node
}

// NewKnown returns the Known of client; with baseline it finds out nothing
// and answers the baseline path.
func NewKnown(client redis.UniversalClient, baseline bool) *Known {
	return &Known{client: client, baseline: baseline}
}

// Verbs returns the verbs of the client's server, probing it the first
// time and after Forget. changed reports a probe whose answer differs from
// the one before (or the first), and refused what the server refused, for
// the caller to log. A failed probe returns its error and the baseline, and
// is tried again next time.
func (k *Known) Verbs(ctx context.Context) (v Verbs, changed bool, refused string, err error) {
	return k.learn(ctx, nil)
}

// NeedsProbe reports whether the next Verbs would ask the server, and one
// node answers for all: a caller that sends a pipeline anyway may add
// DocsCommand to it and hand it to Learn. A cluster or a ring is asked
// node by node (see Probe), by Verbs or by Learn with a nil docs.
func (k *Known) NeedsProbe() bool {
	if k == nil || k.baseline {
		return false
	}
	switch k.client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return false
	}
	_, known := k.Cached()
	return !known
}

// Learn is Verbs from docs, a DocsCommand already sent (unless something is
// known already: then docs is ignored).
func (k *Known) Learn(ctx context.Context, docs *redis.Cmd) (v Verbs, changed bool, refused string, err error) {
	return k.learn(ctx, docs)
}

func (k *Known) learn(ctx context.Context, docs *redis.Cmd) (v Verbs, changed bool, refused string, err error) {
	if k == nil || k.baseline {
		return Verbs{}, false, "", nil
	}
	if v, known := k.Cached(); known {
		return v, false, "", nil
	}
	k.probing.Lock()
	defer k.probing.Unlock()
	before := k.state.Load()
	if before != nil && before.known {
		return before.verbs, false, "", nil // found out while this call waited
	}
	if docs == nil {
		v, refused, err = Probe(ctx, k.client)
	} else {
		v, refused, err = fromDocs(ctx, k.client, docs)
	}
	if err != nil {
		return Verbs{}, false, "", err
	}
	changed = before == nil || v != before.verbs
	k.state.Store(&knownState{verbs: v, known: true})
	return v, changed, refused, nil
}

// Cached returns the verbs of the current node without asking, and
// whether they are known (always, for a forced baseline).
func (k *Known) Cached() (Verbs, bool) {
	if k == nil || k.baseline {
		return Verbs{}, true
	}
	if st := k.state.Load(); st != nil {
		return st.verbs, st.known
	}
	return Verbs{}, false
}

// Current returns the verbs found out last, without probing.
func (k *Known) Current() Verbs {
	v, _ := k.Cached()
	return v
}

// Path names the path in use: Verbs.String() of the last answer,
// "baseline" when forced, "" before the first answer.
func (k *Known) Path() string {
	if k == nil || k.baseline {
		return "baseline"
	}
	st := k.state.Load()
	if st == nil {
		return ""
	}
	return st.verbs.String()
}

// Forget makes the next Verbs probe again: a failover may have moved the
// client to a node of another version, or the server refused a newer verb.
// Until then, Cached answers what was known, as not known.
func (k *Known) Forget() {
	if k == nil {
		return
	}
	for {
		st := k.state.Load()
		if st == nil || !st.known {
			return
		}
		if k.state.CompareAndSwap(st, &knownState{verbs: st.verbs}) {
			return
		}
	}
}
