package loop

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The XAUTOCLAIM reply differs between servers: Redis 6.2 answers with two
// elements and reports a claimed entry whose body is gone as a bare null;
// Redis 7 and Valkey add a third element listing deleted ids. With RESP3 a
// client may see an entry's fields as a map.
func TestParseAutoClaim(t *testing.T) {
	tests := []struct {
		name        string
		reply       []any
		wantNext    string
		wantIDs     []string
		wantNil     []bool
		wantDeleted []string
		wantNulls   int
	}{
		{
			name:     "redis 6.2 with a deleted body",
			reply:    []any{"0-0", []any{[]any{"1-1", []any{"uuid", "a", "payload", "x"}}, nil}},
			wantNext: "0-0", wantIDs: []string{"1-1"}, wantNil: []bool{false}, wantNulls: 1,
		},
		{
			name:     "an entry without fields",
			reply:    []any{"0-0", []any{[]any{"2-1", nil}}},
			wantNext: "0-0", wantIDs: []string{"2-1"}, wantNil: []bool{true},
		},
		{
			name:     "redis 7 and valkey",
			reply:    []any{"5-0", []any{[]any{"1-1", []any{"uuid", "a", "payload", "x"}}}, []any{"3-1", "4-1"}},
			wantNext: "5-0", wantIDs: []string{"1-1"}, wantNil: []bool{false}, wantDeleted: []string{"3-1", "4-1"},
		},
		{
			name:     "fields as a map",
			reply:    []any{"0-0", []any{[]any{"1-1", map[any]any{"uuid": "a", "payload": "x"}}}, []any{}},
			wantNext: "0-0", wantIDs: []string{"1-1"}, wantNil: []bool{false},
		},
		{name: "nothing to claim", reply: []any{"0-0", []any{}, []any{}}, wantNext: "0-0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseAutoClaim(tt.reply)
			require.NoError(t, err)
			assert.Equal(t, tt.wantNulls, c.Nulls)
			assert.Equal(t, tt.wantNext, c.Next)
			assert.Equal(t, tt.wantDeleted, c.Deleted)
			require.Len(t, c.Entries, len(tt.wantIDs))
			for i, m := range c.Entries {
				assert.Equal(t, tt.wantIDs[i], m.ID)
				assert.Equal(t, tt.wantNil[i], m.Fields == nil, "entry %s body", m.ID)
				if m.Fields != nil {
					assert.Equal(t, "a", m.Fields["uuid"])
				}
			}
		})
	}
}

func TestParseAutoClaimRejectsMalformedReplies(t *testing.T) {
	for name, reply := range map[string][]any{
		"too short":      {"0-0"},
		"cursor type":    {1, []any{}},
		"entry shape":    {"0-0", []any{[]any{"1-1"}}},
		"odd field list": {"0-0", []any{[]any{"1-1", []any{"uuid"}}}},
		"field name":     {"0-0", []any{[]any{"1-1", []any{1, "a"}}}},
	} {
		_, err := parseAutoClaim(reply)
		assert.Error(t, err, name)
	}
}
