package partition

import (
	"math/rand/v2"
	"sync/atomic"
)

// Of returns the partition of key among n partitions (n >= 1): the FNV-1a
// 32-bit hash of key's bytes (Go strings are the UTF-8 bytes a producer in
// another language must hash), modulo n. The hash starts at 2166136261 and
// takes each byte b in turn as h = (h XOR b) * 16777619, modulo 2^32; the
// partition is h mod n, with h read as an unsigned 32-bit number. In
// Python:
//
//	h = 2166136261
//	for b in key.encode("utf-8"):
//	    h = ((h ^ b) * 16777619) & 0xFFFFFFFF
//	partition = h % n
//
// The empty key is a key like any other (partition 2166136261 mod n); a
// message without a key is spread instead (see [Spreader]).
func Of(key string, n int) int {
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= prime32
	}
	return int(h % uint32(n))
}

// Spreader picks the partitions of messages without a key, so that they
// spread evenly: round-robin over the n partitions, from a random start, so
// that many publishers that start together do not all begin with partition
// 0. Its methods are safe for concurrent use.
type Spreader struct {
	n    uint32
	next atomic.Uint32
}

// NewSpreader returns a Spreader over n partitions (n >= 1).
func NewSpreader(n int) *Spreader {
	s := &Spreader{n: uint32(n)}
	s.next.Store(rand.Uint32N(uint32(n)))
	return s
}

// Next returns the partition of the next message without a key.
func (s *Spreader) Next() int {
	return int((s.next.Add(1) - 1) % s.n)
}
