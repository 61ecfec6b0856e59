// Package slot computes the hash slot of a key as a Redis or Valkey Cluster
// does: CRC16 (XMODEM) of the key's hash tag, or of the whole key when it has
// none, modulo 16384.
package slot

// Count is the number of hash slots of a cluster.
const Count = 16384

// Of returns the hash slot of key.
func Of(key string) int {
	return int(crc16(0, Tag(key)) % Count)
}

// HasTag reports whether a cluster hashes only part of key: its hash tag.
func HasTag(key string) bool { return Tag(key) != key }

// Tag returns the part of key that a cluster hashes: the bytes between the
// first '{' and the first '}' after it, when there is at least one byte
// between them; otherwise the whole key.
func Tag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j == i+1 {
					return key
				}
				return key[i+1 : j]
			}
		}
		return key
	}
	return key
}

// Prefix is the hash of the first bytes of keys without a hash tag, which
// the slots of every key that begins with them continue: Of(s+t) is
// PrefixOf(s).Slot(t) when s+t has no '{'.
type Prefix uint16

// PrefixOf returns the hash of s, for keys that begin with it.
func PrefixOf(s string) Prefix { return Prefix(crc16(0, s)) }

// Slot returns the slot of the key that is p's start followed by rest.
func (p Prefix) Slot(rest []byte) int { return int(crc16(uint16(p), rest) % Count) }

// crc16 continues the CRC-16/XMODEM crc (polynomial 0x1021, initial
// value 0, no reflection, no final xor) over b.
func crc16[T string | []byte](crc uint16, b T) uint16 {
	for i := 0; i < len(b); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^b[i]]
	}
	return crc
}

// crcTable holds the CRC of each byte value, one byte at a time.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
