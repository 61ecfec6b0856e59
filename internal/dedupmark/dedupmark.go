// Package dedupmark holds the layout of the marks valkeystream's
// Deduplicator keeps in the server, one string key per message and
// namespace, so that the Deduplicator and the valkeystream command read and
// write them alike.
//
// A mark's key is the key prefix, the namespace, ":" and the message UUID
// ([Key]). Unless the Deduplicator is given a namespace, it is the stream
// key and the consumer group the message was delivered from, joined by ":"
// ([GroupNamespace]). The value is [Done] once a handling succeeded, for
// the dedup window, or [Running] plus a token unique to one handling while
// that handling runs (with a short time to live it renews).
package dedupmark

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// Mark values.
const (
	// Done marks a message handled successfully.
	Done = "done"
	// Running begins the mark of a handling in progress.
	Running = "running:"
)

// Key returns the key of the mark of the message uuid in namespace.
func Key(prefix, namespace, uuid string) string {
	return prefix + namespace + ":" + uuid
}

// GroupNamespace returns the namespace of the messages a consumer group
// of stream (a stream key) handles.
func GroupNamespace(stream, group string) string {
	return stream + ":" + group
}

// IsRunning reports whether a mark's value is that of a handling in
// progress.
func IsRunning(value string) bool { return strings.HasPrefix(value, Running) }

// CompareAndDelete deletes KEYS[1] if it holds ARGV[1], and returns how
// many keys it deleted: a mark is removed only while it is the one meant.
var CompareAndDelete = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
