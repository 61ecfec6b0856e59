package partition

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
// The empty key is a key like any other (partition 2166136261 mod n); the
// Publisher routes a message without a key by its UUID.
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
