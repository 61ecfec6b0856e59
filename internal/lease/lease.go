// Package lease gives a consumer name of valkeystream to one live
// subscription at a time, in any process, through a lease on the server,
// and removes the consumers of a group that left and hold nothing pending.
//
// The lease of name N of group G on stream S is a string key
// S + ":lease:" + G + ":" + N (a ':' or '%' in G is escaped as %3A or %25,
// so that no two groups share a key) holding a random token of the
// subscription, with a TTL. Every command touches one key, and every key
// begins with the stream key, so one ACL key pattern per topic covers them
// all; on a cluster a lease key shares the stream's slot only when the
// stream key has a hash tag, which no command needs.
//
// A subscription takes the first name of Consumer, Consumer-2, Consumer-3,
// ... whose lease is free, without waiting for one to lapse: [QueueFirst]
// queues the try of the base name on a pipeline the caller runs with other
// commands, and [First.Take] goes on from its reply. [Lease.Keep] starts the
// keeper goroutine that renews the lease and ends the subscription when the
// name is lost, and returns the release that deletes the lease when the
// subscription ends. An [Adopter] takes over the pending entries of the
// other names of the base whose holders died, once their leases lapse. A
// [Pruner] removes the consumers that departed.
package lease

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/coalesce"
)

// Config is what the lease of one subscription's consumer name reads, with
// the Subscriber's settings already defaulted and validated (see
// valkeystream's SubscriberConfig, where each is documented).
type Config struct {
	Stream, Group string
	// Consumer is the base name: the names tried are Consumer,
	// Consumer-2, Consumer-3, ...
	Consumer string
	// TTL is the lease's time to live (ConsumerLeaseTTL).
	TTL time.Duration
}

// Deps are what the lease of a subscription is handed by its Subscriber.
type Deps struct {
	Client redis.UniversalClient
	// Faults counts the failures of renewals and releases, and a lost name.
	Faults *atomic.Int64
	// Spawn runs f in a goroutine that the Subscriber's Close waits for.
	Spawn func(f func())
	// Logger logs the search for a free name (and, until Keep is handed
	// one of its own, the release).
	Logger watermill.LoggerAdapter
	// TakeError says what a failure to take the lease on name means to the
	// caller of Subscribe.
	TakeError func(name string, err error) error
	// Pipes, unless nil, carries the release in a pipeline shared with the
	// releases of the other subscriptions on the client that end at the
	// same time.
	Pipes *coalesce.Pipes
}

// Key returns the key of the lease on consumer name of group on stream.
func Key(stream, group, name string) string {
	return stream + ":lease:" + groupEscaper.Replace(group) + ":" + name
}

var groupEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// indexedName returns the consumer name of index n (1 for the base name itself).
func indexedName(base string, n int) string {
	if n == 1 {
		return base
	}
	return base + "-" + strconv.Itoa(n)
}

// Lease is a subscription's lease on its consumer name. Its keeper
// goroutine (see Keep) renews it; the release deletes it once the keeper
// has returned.
type Lease struct {
	key     string // the lease key
	name    string // the consumer name
	token   string
	ttl     time.Duration
	deps    Deps
	stopped chan struct{} // closed when keep returns
}

// newLease returns a lease on name, not taken yet, with a token of its own.
func newLease(cfg Config, deps Deps, name string) *Lease {
	return &Lease{
		key:     Key(cfg.Stream, cfg.Group, name),
		name:    name,
		token:   newToken(),
		ttl:     cfg.TTL,
		deps:    deps,
		stopped: make(chan struct{}),
	}
}

// Name returns the consumer name the lease is on.
func (l *Lease) Name() string { return l.name }

// newToken returns a token no other lease has: the host and process that
// hold it (for whoever reads the key) and a random part.
func newToken() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + watermill.NewShortUUID()
}

// liveTokens are the tokens of the leases that subscriptions of this process
// hold or are taking, so that a name held by a sibling in this process is
// known to be alive without watching it.
var liveTokens = struct {
	sync.Mutex
	m map[string]struct{}
}{m: map[string]struct{}{}}

func addLiveToken(token string) {
	liveTokens.Lock()
	liveTokens.m[token] = struct{}{}
	liveTokens.Unlock()
}

func dropLiveToken(token string) {
	liveTokens.Lock()
	delete(liveTokens.m, token)
	liveTokens.Unlock()
}

func isLiveToken(token string) bool {
	liveTokens.Lock()
	defer liveTokens.Unlock()
	_, ok := liveTokens.m[token]
	return ok
}
