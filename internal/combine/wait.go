package combine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReplicaWait is how many replicas must acknowledge a round trip's entries,
// and for how long to wait for them (WAIT numreplicas timeout). Zero
// Replicas: no WAIT.
type ReplicaWait struct {
	Replicas int
	Timeout  time.Duration
}

// NotReplicatedError reports a WAIT that counted fewer replicas than asked,
// or whose reply was lost: the entries were written on the master, but not
// confirmed by enough replicas.
type NotReplicatedError struct {
	Wait  ReplicaWait // what was asked
	Acked int64       // how many replicas acknowledged; meaningless when Err is set
	Err   error       // why WAIT failed; nil when it answered
}

func (e *NotReplicatedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("WAIT %d %d failed: %v", e.Wait.Replicas, e.Wait.Timeout.Milliseconds(), e.Err)
	}
	return fmt.Sprintf("%d of %d replicas acknowledged within %s", e.Acked, e.Wait.Replicas, e.Wait.Timeout)
}

func (e *NotReplicatedError) Unwrap() error { return e.Err }

// Pipeline returns a pipeline on client for writes to key that WAIT may
// follow. WAIT counts the writes of its own connection, so it must follow
// the writes on the connection that carried them; a cluster client would
// send the keyless WAIT to another node (or refuse it in a pipeline), so
// with WAIT on a cluster the round trip goes to the master of key's slot
// directly. A MOVED reply then fails the call (nothing was written) and
// makes the cluster client reload its slot map.
func (w ReplicaWait) Pipeline(ctx context.Context, client redis.UniversalClient, key string) (redis.Pipeliner, error) {
	cluster, ok := client.(*redis.ClusterClient)
	if !ok || w.Replicas == 0 {
		return client.Pipeline(), nil
	}
	master, err := cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	return master.Pipeline(), nil
}

// RunScript runs script, whose keys lie in key's slot, and then, with
// replicas to wait for, WAIT in the same round trip on the same connection.
// It returns the script's error, or else the check of the WAIT reply: nil,
// or a *NotReplicatedError.
func (w ReplicaWait) RunScript(ctx context.Context, client redis.UniversalClient, key string, script *redis.Script, keys []string, args ...any) error {
	run, err := w.Run(ctx, client, key, script, keys, args...)
	if err != nil {
		return err
	}
	if err := run.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return nil
}

// Run runs script as RunScript does, and returns its reply. The error is
// the failure to reach key's master, or the check of the WAIT reply when
// the script succeeded; the script's own error is the reply's.
func (w ReplicaWait) Run(ctx context.Context, client redis.UniversalClient, key string, script *redis.Script, keys []string, args ...any) (*redis.Cmd, error) {
	if w.Replicas == 0 {
		return script.Run(ctx, client, keys, args...), nil
	}
	pipe, err := w.Pipeline(ctx, client, key)
	if err != nil {
		return nil, err
	}
	run := script.Eval(ctx, pipe, keys, args...)
	wait := w.command(ctx)
	_ = pipe.Process(ctx, wait)
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if err := run.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return run, nil
	}
	return run, w.check(wait)
}

// command returns the WAIT command for w.
func (w ReplicaWait) command(ctx context.Context) *redis.IntCmd {
	return redis.NewIntCmd(ctx, "wait", w.Replicas, w.Timeout.Milliseconds())
}

// check returns nil when the WAIT reply counts enough replicas (or there was
// no WAIT), else a *NotReplicatedError.
func (w ReplicaWait) check(wait *redis.IntCmd) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return &NotReplicatedError{Wait: w, Err: err}
	case n < int64(w.Replicas):
		return &NotReplicatedError{Wait: w, Acked: n}
	}
	return nil
}
