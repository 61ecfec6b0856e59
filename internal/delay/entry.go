package delay

import (
	"fmt"
	"strconv"
	"strings"
)

// EncodeEntry encodes the fields of a stream entry, as a Marshaler returns
// them, into one string that the scripts decode (see DecodeEntryLua): each
// field and value as its length in decimal, ':', and its bytes. The same
// fields always give the same string, so a message published twice is
// stored once. A field of a type other than string, []byte, int, int64,
// float64 or bool is an error.
func EncodeEntry(fields []any) (string, error) {
	var b strings.Builder
	for _, f := range fields {
		var s string
		switch v := f.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		case float64:
			s = strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			s = map[bool]string{false: "0", true: "1"}[v]
		default:
			return "", fmt.Errorf("entry field of type %T: a Marshaler for delayed messages may return strings, byte slices, integers, floats and booleans", f)
		}
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String(), nil
}

// DecodeEntryLua defines the Lua function fields(m), which reverses
// EncodeEntry: it returns the fields and values of the encoded entry m, in
// order. A script that decodes entries starts with it.
const DecodeEntryLua = `
local function fields(m)
  local f, p = {}, 1
  while p <= #m do
    local c = string.find(m, ':', p, true)
    local n = tonumber(string.sub(m, p, c - 1))
    f[#f + 1] = string.sub(m, c + 1, c + n)
    p = c + n + 1
  end
  return f
end
`

// DecodeEntry reverses EncodeEntry, as DecodeEntryLua does in the scripts:
// it returns the fields and values of the encoded entry m, in order. A
// string EncodeEntry cannot have written is an error that says where it
// stops making sense.
func DecodeEntry(m string) ([]string, error) {
	var out []string
	for p := 0; p < len(m); {
		c := strings.IndexByte(m[p:], ':')
		if c < 0 {
			return nil, fmt.Errorf("encoded entry: no ':' after the length at byte %d", p)
		}
		n, err := strconv.Atoi(m[p : p+c])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("encoded entry: %q at byte %d is not a length", m[p:p+c], p)
		}
		start := p + c + 1
		if n > len(m)-start {
			return nil, fmt.Errorf("encoded entry: a value of %d bytes at byte %d runs past the end (%d bytes)", n, start, len(m))
		}
		out = append(out, m[start:start+n])
		p = start + n
	}
	if len(out)%2 != 0 {
		return nil, fmt.Errorf("encoded entry: %d strings, not field and value pairs", len(out))
	}
	return out, nil
}
