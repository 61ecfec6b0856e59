// Package slot computes the hash slot of a key as a Redis or Valkey Cluster
// does: CRC16 (XMODEM) of the key's hash tag, or of the whole key when it has
// none, modulo 16384.
package slot

// Count is the number of hash slots of a cluster.
const Count = 16384

// Of returns the hash slot of key.
func Of(key string) int {
	return int(crc16(Tag(key)) % Count)
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

// crc16 is CRC-16/XMODEM: polynomial 0x1021, initial value 0, no
// reflection, no final xor.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
