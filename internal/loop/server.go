package loop

import (
	"context"
	"time"
)

// Entry is a stream entry as the server sent it.
type Entry struct {
	ID     string
	Fields map[string]any // nil when the body is gone from the stream
	// Count is the delivery count of an entry a read of new entries
	// claimed (XREADGROUP ... CLAIM, see ReadArgs.Claim), this delivery
	// included, so at least 2; 0 for every other entry (a read of new
	// entries delivers them for the first time).
	Count int64
}

// Server is every call a group subscription makes to the server, for one
// stream, group and consumer name. RedisServer is the implementation; the
// loop's tests use a fake. A call returns the server's error as it came
// (NOGROUP included), and an empty read no error.
type Server interface {
	// Send makes one round trip of t: its Acks (XACK), its reads of new
	// entries (XREADGROUP ... >, none of them blocking), its entries handed
	// back and its deferred entries handed back, in that order. It is the only way an XACK leaves.
	Send(ctx context.Context, t Trip) TripReply
	// Block reads up to count new entries, waiting up to block for the
	// first, over a connection of its own that Interrupt can cut short.
	Block(ctx context.Context, count int64, block time.Duration) ([]Entry, error)
	// ReadOwn reads up to count of this consumer's own pending entries
	// after the id from ("0": from the start).
	ReadOwn(ctx context.Context, from string, count int64) ([]Entry, error)
	// ListOwn lists the ids of up to count of this consumer's own pending
	// entries from the XPENDING range start from ("-": the start).
	ListOwn(ctx context.Context, from string, count int64) ([]string, error)
	// Claim reclaims up to count entries idle for longer than the claim
	// threshold, from the XAUTOCLAIM cursor from.
	Claim(ctx context.Context, from string, count int64) (Claimed, error)
	// Hold resets the idle time of the entries ids that are pending for this
	// consumer, and returns for each its delivery count, -1 when its body
	// is gone from the stream (it stays pending), or 0 when it is not
	// pending for this consumer.
	Hold(ctx context.Context, ids []string) ([]int64, error)
	// ClaimBack claims a Nacked entry again for this consumer, which grows
	// its delivery count, while its count is still count (see ClaimedBack).
	ClaimBack(ctx context.Context, id string, count int64) (ClaimedBack, error)
	// Failed is told every failed call's error, so that the clients it uses
	// can look for a new master, and returns the wait before the next try:
	// delay, or less while a failover may be under way.
	Failed(err error, delay time.Duration) time.Duration
	// Interrupt ends a Block in progress, and every later one at once: the
	// subscription ends.
	Interrupt()
}

// Trip is one round trip of Acks, reads of new entries and entries handed
// back (see Server.Send).
type Trip struct {
	Acks     []string
	Reads    []int64 // the count of each read, sent in order
	HandBack []string
	// Later are deferred entries handed back, each with the idle time that
	// makes a peer's claim take it when it is due.
	Later []Later
	// Last marks the last round trip of a subscription that ends: a
	// Server may send it together with the last round trips of others
	// ending at the same time (see RedisServerOptions.Pipes).
	Last bool
}

// Later is a deferred entry handed back: XCLAIM ... IDLE <Idle> JUSTID on
// this consumer's name (see HandBackArgs).
type Later struct {
	ID   string
	Idle time.Duration
}

// TripReply is the outcome of a Trip.
type TripReply struct {
	Acked   int64 // entries the XACK acknowledged (still pending ones)
	AckErr  error
	Entries []Entry // what the reads brought, in order
	// Full reports whether every read brought all it asked for.
	Full    bool
	ReadErr error // of the first read that failed; the ones after it may have taken entries
	BackErr error
}

// Claimed is what a claim brought.
type Claimed struct {
	Next    string  // the cursor to go on from; "0-0": the pending list was scanned to its end
	Entries []Entry // an entry with nil Fields has lost its body (it stays pending)
	Deleted []string
	// Nulls counts claimed entries whose bodies are gone and that came
	// without their ids (Redis 6.2): they are pending for this consumer now.
	Nulls int
}

// ClaimedBack is what a Nack claim found: Status "ok" (claimed, with the new
// count and the body), "gone" (acknowledged elsewhere), "taken" (another
// consumer holds it) or "missing" (its body is gone; it stays pending).
type ClaimedBack struct {
	Status string
	Count  int64
	Fields map[string]any
}
