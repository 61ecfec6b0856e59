package delay

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestParseDelayedMoves(t *testing.T) {
	reply := func(v any, err error) *redis.Cmd {
		c := redis.NewCmd(context.Background())
		c.SetVal(v)
		c.SetErr(err)
		return c
	}
	const wrongType = "WRONGTYPE Operation against a key holding the wrong kind of value"
	refused := errors.New("NOPERM this user has no permissions to run the 'evalsha' command")
	for _, tc := range []struct {
		name  string
		cmd   *redis.Cmd
		moved []int    // by topic
		errs  []string // by topic: "" for none, else text the error contains
	}{
		{"counts", reply([]any{int64(0), int64(100)}, nil), []int{0, 100}, []string{"", ""}},
		{"one pair failed", reply([]any{wrongType, int64(3)}, nil), []int{0, 3}, []string{wrongType, ""}},
		{"unexpected value", reply([]any{[]any{}}, nil), []int{0}, []string{"unexpected result"}},
		{"too few results", reply([]any{int64(1)}, nil), []int{0, 0}, []string{"1 results for 2 topics", "1 results for 2 topics"}},
		{"call failed", reply(nil, refused), []int{0, 0}, []string{"NOPERM", "NOPERM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseMoves(tc.cmd, len(tc.moved))
			if len(got) != len(tc.moved) {
				t.Fatalf("%d results, want %d", len(got), len(tc.moved))
			}
			for i, r := range got {
				errText := ""
				if r.err != nil {
					errText = r.err.Error()
				}
				if r.moved != tc.moved[i] || (errText == "") != (tc.errs[i] == "") || !strings.Contains(errText, tc.errs[i]) {
					t.Errorf("result %d = moved %d, error %q; want moved %d, error containing %q", i, r.moved, errText, tc.moved[i], tc.errs[i])
				}
			}
		})
	}
}
