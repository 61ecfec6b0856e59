package partition

import "strings"

// Slots is the number of hash slots of a Redis (or Valkey) Cluster.
const Slots = 16384

// KeySlot returns the cluster hash slot of key, as CLUSTER KEYSLOT answers:
// CRC16 of the key's hash tag (the text between the first '{' and the first
// '}' after it, when that text is not empty) or else of the whole key,
// modulo 16384.
func KeySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return int(crc16(key) % Slots)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0, no
// reflection, no final XOR), the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
