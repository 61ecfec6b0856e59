package valkeystream

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/combine"
)

// combiners shares the round trips of a Publisher's concurrent calls for
// each stream (see internal/combine), and holds the replica wait that those
// round trips and the writes of delayed messages apply.
type combiners struct {
	streams *combine.Combiner
	wait    replicaWait
}

// newCombiners returns the combiners of a Publisher that writes with client,
// waits for replicas as wait says, and counts its round trips in stats.
func newCombiners(client redis.UniversalClient, wait combine.ReplicaWait, stats *publisherCounters) combiners {
	return combiners{streams: combine.New(client, wait, stats.roundTrip), wait: replicaWait{wait}}
}

// replicaWait is the Publisher's replica wait, whose WAIT failures wrap
// ErrNotReplicated.
type replicaWait struct{ combine.ReplicaWait }

// runScript runs script, whose keys lie in key's slot, and then, with
// replicas to wait for, WAIT in the same round trip on the same connection.
// It returns the script's error, or else an error wrapping ErrNotReplicated
// when too few replicas acknowledged.
func (w replicaWait) runScript(ctx context.Context, client redis.UniversalClient, key string, script *redis.Script, keys []string, args ...any) error {
	return notReplicated(w.RunScript(ctx, client, key, script, keys, args...))
}

// notReplicated returns err, or, when err is the combiner's report of a WAIT
// that fell short, an error wrapping both ErrNotReplicated and that report.
func notReplicated(err error) error {
	if short, ok := errors.AsType[*combine.NotReplicatedError](err); ok {
		return fmt.Errorf("%w: %w", ErrNotReplicated, short)
	}
	return err
}
