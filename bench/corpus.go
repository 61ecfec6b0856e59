package main

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// A corpus is a deterministic set of n messages: message i always has the
// same UUID, payload and metadata for the same seed, so every side of a
// scenario gets identical messages and the same ones are Nacked.
//
// The payload starts with the message's sequence number as eight hex digits,
// so that a consumer can tell which message arrived without keeping a table
// of UUIDs (whose size would grow with the backlog and spoil the memory
// scenario). The rest of the payload is filler.
type corpus struct {
	seed uint64
	n    int
	size int // payload bytes, at least seqDigits
}

const (
	seqDigits = 8
	// metadataKey is the one metadata entry every message carries, as the
	// messages of ThreeDotsLabs' watermill-benchmark do.
	metadataKey = "correlation_id"
	// nackOneIn is how rare a Nacked first delivery is: one message in
	// nackOneIn, chosen by the hash of its UUID.
	nackOneIn = 100
)

func newCorpus(seed uint64, n, size int) (corpus, error) {
	if size < seqDigits {
		return corpus{}, fmt.Errorf("payload size %d is below the %d bytes that carry the sequence number", size, seqDigits)
	}
	if n <= 0 || uint64(n) > 1<<(4*seqDigits) {
		return corpus{}, fmt.Errorf("message count %d is out of range", n)
	}
	return corpus{seed: seed, n: n, size: size}, nil
}

// splitmix64 is a small, well-mixed hash of x.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// uuid returns message i's UUID: random-looking, version 4 layout.
func (c corpus) uuid(i int) string {
	hi := splitmix64(c.seed ^ uint64(i)<<1)
	lo := splitmix64(c.seed ^ (uint64(i)<<1 | 1))
	hi = hi&^(0xf<<12) | 0x4<<12       // version 4
	lo = lo&^(0x3<<62) | uint64(2)<<62 // RFC 4122 variant
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x",
		hi>>32, (hi>>16)&0xffff, hi&0xffff, lo>>48, lo&0xffffffffffff)
}

// correlationID returns message i's metadata value (22 characters).
func (c corpus) correlationID(i int) string {
	return fmt.Sprintf("%022x", splitmix64(^c.seed^uint64(i)))
}

// payload returns message i's payload: its sequence number, then filler.
func (c corpus) payload(i int) []byte {
	p := make([]byte, c.size)
	const hex = "0123456789abcdef"
	for d := range seqDigits {
		p[seqDigits-1-d] = hex[(i>>(4*d))&0xf]
	}
	for j := seqDigits; j < len(p); j++ {
		p[j] = 'a' + byte((i+j)%26)
	}
	return p
}

// message returns a new Watermill message for message i.
func (c corpus) message(i int) *message.Message {
	msg := message.NewMessage(c.uuid(i), c.payload(i))
	msg.Metadata.Set(metadataKey, c.correlationID(i))
	return msg
}

// messages returns new Watermill messages for messages from..to-1.
func (c corpus) messages(from, to int) []*message.Message {
	msgs := make([]*message.Message, 0, to-from)
	for i := from; i < to; i++ {
		msgs = append(msgs, c.message(i))
	}
	return msgs
}

// parseSeq reads the sequence number at the start of a payload. It returns
// false for a payload that no corpus could have made.
func parseSeq[P ~string | ~[]byte](p P) (int, bool) {
	if len(p) < seqDigits {
		return 0, false
	}
	n := 0
	for i := range seqDigits {
		switch b := p[i]; {
		case b >= '0' && b <= '9':
			n = n<<4 | int(b-'0')
		case b >= 'a' && b <= 'f':
			n = n<<4 | int(b-'a'+10)
		default:
			return 0, false
		}
	}
	return n, true
}

// nackFirst reports whether the first delivery of the message with this UUID
// is Nacked in the nack scenario: about one message in nackOneIn, the same
// ones for every side and every run with the same seed.
func nackFirst(uuid string) bool {
	h := uint32(2166136261) // 32-bit FNV-1a
	for i := 0; i < len(uuid); i++ {
		h ^= uint32(uuid[i])
		h *= 16777619
	}
	return h%nackOneIn == 0
}
