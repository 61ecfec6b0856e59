package valkeystream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// This file reads and writes one MessagePack value: a map from strings to
// strings, the form in which watermill-redisstream stores a message's
// metadata in an entry's "metadata" field. Only the encodings its encoder
// produces for that map are read (a fixmap, map 16 or map 32 of strings in
// fixstr, str 8, str 16 or str 32 form, or nil for no map), together with the
// bin forms and nil for a string, which its decoder also takes for one. Any
// other type, a length past the end of the data, a key that occurs twice or
// bytes after the map make the data malformed.

// MessagePack type codes used for a map of strings.
const (
	mpNil       = 0xc0
	mpFixMapMin = 0x80 // a map of up to 15 pairs: 0x80 | length
	mpFixMapMax = 0x8f
	mpMap16     = 0xde
	mpMap32     = 0xdf
	mpFixStrMin = 0xa0 // a string of up to 31 bytes: 0xa0 | length
	mpFixStrMax = 0xbf
	mpStr8      = 0xd9
	mpStr16     = 0xda
	mpStr32     = 0xdb
	mpBin8      = 0xc4
	mpBin16     = 0xc5
	mpBin32     = 0xc6
)

var errMsgpackTooLong = errors.New("a length does not fit in 32 bits, the most MessagePack can hold")

// appendMsgpackStrings appends m to b as a MessagePack map in the encodings
// watermill-redisstream's encoder uses (the shortest fixmap/map 16/map 32 and
// fixstr/str 8/str 16/str 32), with the keys in increasing order.
func appendMsgpackStrings(b []byte, m map[string]string) ([]byte, error) {
	n := len(m)
	switch {
	case n < 16:
		b = append(b, mpFixMapMin|byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, mpMap16), uint16(n))
	case uint64(n) <= math.MaxUint32:
		b = binary.BigEndian.AppendUint32(append(b, mpMap32), uint32(n))
	default:
		return nil, errMsgpackTooLong
	}
	keys := make([]string, 0, n)
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var err error
	for _, k := range keys {
		if b, err = appendMsgpackString(b, k); err != nil {
			return nil, err
		}
		if b, err = appendMsgpackString(b, m[k]); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func appendMsgpackString(b []byte, s string) ([]byte, error) {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, mpFixStrMin|byte(n))
	case n <= math.MaxUint8:
		b = append(b, mpStr8, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, mpStr16), uint16(n))
	case uint64(n) <= math.MaxUint32:
		b = binary.BigEndian.AppendUint32(append(b, mpStr32), uint32(n))
	default:
		return nil, errMsgpackTooLong
	}
	return append(b, s...), nil
}

// decodeMsgpackStrings reads data as one MessagePack map of strings and
// nothing else. A nil map reads as an empty one. The keys and values share
// data's memory (strings are immutable, so that is safe). The error says what
// is wrong and at which byte.
func decodeMsgpackStrings(data string) (map[string]string, error) {
	r := msgpackReader{data: data}
	code, err := r.byte()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case code == mpNil:
		n = 0
	case code >= mpFixMapMin && code <= mpFixMapMax:
		n = uint64(code & 0x0f)
	case code == mpMap16:
		n, err = r.uint(2)
	case code == mpMap32:
		n, err = r.uint(4)
	default:
		return nil, fmt.Errorf("byte 0 is type code 0x%02x, want a map (0x80-0x8f, 0xde, 0xdf) or nil (0xc0)", code)
	}
	if err != nil {
		return nil, err
	}
	// Every pair takes at least two bytes: a length claiming more pairs
	// than that is malformed, and is refused before anything is allocated.
	if n > uint64(r.left())/2 {
		return nil, fmt.Errorf("the map claims %d pairs but only %d bytes follow", n, r.left())
	}
	m := make(map[string]string, n)
	for range n {
		at := r.off
		k, err := r.string()
		if err != nil {
			return nil, err
		}
		v, err := r.string()
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("key %q at byte %d occurs twice", k, at)
		}
		m[k] = v
	}
	if r.left() > 0 {
		return nil, fmt.Errorf("%d bytes follow the map at byte %d", r.left(), r.off)
	}
	return m, nil
}

// msgpackReader reads MessagePack values from data, from offset off on.
type msgpackReader struct {
	data string
	off  int
}

func (r *msgpackReader) left() int { return len(r.data) - r.off }

func (r *msgpackReader) byte() (byte, error) {
	if r.left() < 1 {
		return 0, fmt.Errorf("the data ends at byte %d, in the middle of a value", r.off)
	}
	r.off++
	return r.data[r.off-1], nil
}

// uint reads a big-endian unsigned integer of size bytes (1, 2 or 4).
func (r *msgpackReader) uint(size int) (uint64, error) {
	if r.left() < size {
		return 0, fmt.Errorf("the data ends at byte %d, in the middle of a length", len(r.data))
	}
	var n uint64
	for i := range size {
		n = n<<8 | uint64(r.data[r.off+i])
	}
	r.off += size
	return n, nil
}

// string reads a string in str or bin form, or nil as "".
func (r *msgpackReader) string() (string, error) {
	at := r.off
	code, err := r.byte()
	if err != nil {
		return "", err
	}
	var n uint64
	switch {
	case code == mpNil:
		return "", nil
	case code >= mpFixStrMin && code <= mpFixStrMax:
		n = uint64(code & 0x1f)
	case code == mpStr8 || code == mpBin8:
		n, err = r.uint(1)
	case code == mpStr16 || code == mpBin16:
		n, err = r.uint(2)
	case code == mpStr32 || code == mpBin32:
		n, err = r.uint(4)
	default:
		return "", fmt.Errorf("byte %d is type code 0x%02x, want a string (0xa0-0xbf, 0xd9-0xdb, 0xc4-0xc6) or nil (0xc0)", at, code)
	}
	if err != nil {
		return "", err
	}
	if n > uint64(r.left()) {
		return "", fmt.Errorf("the string at byte %d claims %d bytes but only %d follow", at, n, r.left())
	}
	s := r.data[r.off : r.off+int(n)]
	r.off += int(n)
	return s, nil
}
