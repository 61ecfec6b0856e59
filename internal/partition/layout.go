package partition

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/slot"
)

// MaxPartitions is the most partitions a topic may have. Each partition
// gets a slot range of Slots/n slots (16 at the most); a larger count would
// leave ranges too narrow to hit quickly with a hash tag.
const MaxPartitions = 1024

// Layout names the keys of a topic's partitions. It is computed from the
// topic's stream key and partition count alone, so that every publisher and
// subscriber, in any language, names the same keys (see the package doc).
type Layout struct {
	stream string
	tags   []string // the hash tag of each partition
}

// NewLayout returns the layout of n partitions (1 <= n <= MaxPartitions) of
// stream. A stream key with a '{' or '}' is refused: the partitions' keys
// carry hash tags of their own, which a brace of the stream key would
// replace, putting every partition in one slot.
func NewLayout(stream string, n int) (*Layout, error) {
	switch {
	case stream == "":
		return nil, errors.New("partition: the stream key is empty; name the topic")
	case strings.ContainsAny(stream, "{}"):
		return nil, fmt.Errorf("partition: stream key %q has a '{' or '}': the keys of a partitioned topic carry hash tags of their own, which spread the partitions over the cluster's slots, and a brace in the topic would put them all in one slot; use a topic without braces", stream)
	case n < 1 || n > MaxPartitions:
		return nil, fmt.Errorf("partition: %d partitions for stream %q; a topic has 1 to %d", n, stream, MaxPartitions)
	}
	l := &Layout{stream: stream, tags: make([]string, n)}
	for i := range l.tags {
		l.tags[i] = findTag(stream, i, n)
	}
	return l, nil
}

// SlotRange returns the slots [lo, hi) where partition i of n puts its keys:
// the middle half of its n-th of the slots, [i*16384/n, (i+1)*16384/n), or
// the whole n-th when that is shorter than 4 slots. Keeping away from the
// edges of the n-th lets a cluster whose masters split the slots near, but
// not exactly at, multiples of 16384/n (as redis-cli --cluster create does)
// still give each master its share.
func SlotRange(i, n int) (lo, hi int) {
	lo, hi = i*Slots/n, (i+1)*Slots/n
	if w := hi - lo; w >= 4 {
		lo, hi = lo+w/4, hi-w/4
	}
	return lo, hi
}

// findTag returns the hash tag of partition i of n of stream: the first of
// stream#i.0, stream#i.1, stream#i.2, ... whose slot lies in SlotRange(i, n).
func findTag(stream string, i, n int) string {
	lo, hi := SlotRange(i, n)
	prefix := stream + "#" + strconv.Itoa(i) + "."
	// The tag has no brace (the stream has none), so its slot is the
	// prefix's hash continued over j's digits: about 2 000 tries a
	// partition at n = 1024.
	p := slot.PrefixOf(prefix)
	var digits []byte
	for j := 0; ; j++ {
		digits = strconv.AppendInt(digits[:0], int64(j), 10)
		if s := p.Slot(digits); lo <= s && s < hi {
			return prefix + string(digits)
		}
	}
}

// N returns the number of partitions.
func (l *Layout) N() int { return len(l.tags) }

// Topic returns the topic's stream key, which no partition uses as a key.
func (l *Layout) Topic() string { return l.stream }

// Tag returns the hash tag of partition i (without braces).
func (l *Layout) Tag(i int) string { return l.tags[i] }

// Slot returns the cluster slot of every key of partition i.
func (l *Layout) Slot(i int) int { return KeySlot(l.tags[i]) }

// Stream returns the stream key of partition i: the topic's stream key,
// ":p", i, and the partition's hash tag in braces, e.g.
// "orders:p3{orders#3.22}" of 12.
func (l *Layout) Stream(i int) string {
	return l.stream + ":p" + strconv.Itoa(i) + "{" + l.tags[i] + "}"
}

// Streams returns the stream keys of every partition, in partition order.
func (l *Layout) Streams() []string {
	keys := make([]string, len(l.tags))
	for i := range keys {
		keys[i] = l.Stream(i)
	}
	return keys
}

// Keys are the keys of one partition for one consumer group, all in the
// partition's slot.
type Keys struct {
	// Stream is the partition's stream key (Layout.Stream).
	Stream string
	// Owner holds "<member>:<epoch>" of the partition's owner in the
	// group, with a TTL: Stream + ":owner:" + group.
	Owner string
	// Epoch counts the acquisitions of the partition in the group, and is
	// never reset: Stream + ":epoch:" + group.
	Epoch string
}

// Keys returns the keys of partition i for group. A ':' or '%' in group is
// escaped as %3A or %25, so that no two groups share a key.
func (l *Layout) Keys(i int, group string) Keys {
	s := l.Stream(i)
	g := groupEscaper.Replace(group)
	return Keys{Stream: s, Owner: s + ":owner:" + g, Epoch: s + ":epoch:" + g}
}

// MembersKey returns the key of the membership of group in the topic: a
// sorted set of the group's live subscriptions (see [Members]). It may be in
// any slot: S + ":members:" + group.
func (l *Layout) MembersKey(group string) string {
	return l.stream + ":members:" + groupEscaper.Replace(group)
}

// DeclarationKey returns the key that holds the partition count of the
// topic of stream key stream: stream + ":partitions".
func DeclarationKey(stream string) string { return stream + ":partitions" }

var groupEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// CountMismatchError is the error of a declaration of a partition count
// other than the one the topic was declared with first.
type CountMismatchError struct {
	Stream   string
	Declared int // the count on the server
	Asked    int // the count of the caller
}

func (e *CountMismatchError) Error() string {
	return fmt.Sprintf("partition: topic %q was declared with %d partitions, not %d; give every publisher and subscriber of a topic the same count (to change it, move to a new topic: the key of a message decides its partition only for a given count)",
		e.Stream, e.Declared, e.Asked)
}

// declareScript sets the partition count if none is set, and returns the
// count set (the caller's, or the one found).
//
// KEYS[1] declaration key, ARGV[1] the count.
var declareScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  return ARGV[1]
end
return redis.call('GET', KEYS[1])
`)

// Declare records that the topic of l has l.N() partitions, unless the topic
// was declared before: then the counts must agree, else the error is a
// *CountMismatchError. The record has no TTL.
func (l *Layout) Declare(ctx context.Context, client redis.Scripter) error {
	key := DeclarationKey(l.stream)
	got, err := declareScript.Run(ctx, client, []string{key}, l.N()).Text()
	if err != nil {
		return fmt.Errorf("partition: declaring %d partitions of topic %q in key %q: %w", l.N(), l.stream, key, err)
	}
	declared, err := strconv.Atoi(got)
	if err != nil {
		return fmt.Errorf("partition: key %q holds %q, not a partition count; it is the declaration of topic %q: delete it or fix it", key, got, l.stream)
	}
	if declared != l.N() {
		return &CountMismatchError{Stream: l.stream, Declared: declared, Asked: l.N()}
	}
	return nil
}
