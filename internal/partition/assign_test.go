package partition

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ownersOf returns the owner of each partition of a split.
func ownersOf(t *testing.T, split map[string][]int, n int) []string {
	t.Helper()
	owners := make([]string, n)
	for m, ps := range split {
		for _, p := range ps {
			require.Empty(t, owners[p], "partition %d given to %s and %s", p, owners[p], m)
			owners[p] = m
		}
	}
	for p, o := range owners {
		require.NotEmpty(t, o, "partition %d given to nobody", p)
	}
	return owners
}

// checkEven fails unless split gives every partition to one member and
// no two members' counts are more than one apart.
func checkEven(t *testing.T, split map[string][]int, members []string, n int) {
	t.Helper()
	ownersOf(t, split, n)
	lo, hi := n, 0
	for _, m := range members {
		ps, ok := split[m]
		require.True(t, ok, "member %s missing from the split", m)
		require.True(t, slices.IsSorted(ps))
		lo, hi = min(lo, len(ps)), max(hi, len(ps))
	}
	require.LessOrEqual(t, hi-lo, 1, "counts from %d to %d: %v", lo, hi, split)
}

func moves(before, after []string) int {
	n := 0
	for p := range before {
		if before[p] != after[p] {
			n++
		}
	}
	return n
}

func counts(split map[string][]int, members []string) []int {
	out := make([]int, len(members))
	for i, m := range members {
		out[i] = len(split[m])
	}
	return out
}

func TestAssignIsEvenAndDependsOnTheSetOnly(t *testing.T) {
	for _, n := range []int{1, 2, 5, 8, 12, 64} {
		for m := 1; m <= 14; m++ {
			var members []string
			for i := range m {
				members = append(members, fmt.Sprintf("sub-%d", i))
			}
			split := Assign(members, n)
			require.Len(t, split, m)
			checkEven(t, split, members, n)
			shuffled := append(slices.Clone(members), members[0])
			slices.Reverse(shuffled)
			assert.Equal(t, split, Assign(shuffled, n), "n=%d m=%d: the order and repeats of the members change the split", n, m)
		}
	}
	assert.Empty(t, Assign(nil, 4))
}

// A split that is even already stays as it is, whoever made it.
func TestRebalanceKeepsAnEvenSplit(t *testing.T) {
	owners := []string{"c", "c", "a", "b", "a", "b", "c"}
	split := Rebalance(owners, []string{"a", "b", "c"})
	assert.Equal(t, map[string][]int{"a": {2, 4}, "b": {3, 5}, "c": {0, 1, 6}}, split)
}

// Joins and leaves on 12 partitions: the counts stay even, and only the
// partitions that must move do.
func TestRebalanceMovesOnlyWhatMust(t *testing.T) {
	const n = 12
	members := []string{"a", "b", "c"}
	owners := ownersOf(t, Assign(members, n), n)
	assert.Equal(t, []int{4, 4, 4}, counts(Rebalance(owners, members), members))

	steps := []struct {
		name    string
		members []string
		counts  []int
		moved   int
	}{
		{"d joins", []string{"a", "b", "c", "d"}, []int{3, 3, 3, 3}, 3},
		{"e joins", []string{"a", "b", "c", "d", "e"}, []int{3, 3, 2, 2, 2}, 2},
		{"b leaves", []string{"a", "c", "d", "e"}, []int{3, 3, 3, 3}, 3}, // b had 3
		{"a leaves", []string{"c", "d", "e"}, []int{4, 4, 4}, 3},
		{"d leaves", []string{"c", "e"}, []int{6, 6}, 4},
		{"f and g join", []string{"c", "e", "f", "g"}, []int{3, 3, 3, 3}, 6},
	}
	for _, s := range steps {
		split := Rebalance(owners, s.members)
		checkEven(t, split, s.members, n)
		after := ownersOf(t, split, n)
		assert.Equal(t, s.counts, counts(split, s.members), s.name)
		assert.Equal(t, s.moved, moves(owners, after), "%s: partitions moved", s.name)
		for p := range owners {
			if owners[p] != after[p] && slices.Contains(s.members, owners[p]) {
				// A member gives up a partition only when it had more than
				// its share.
				had := 0
				for _, o := range owners {
					if o == owners[p] {
						had++
					}
				}
				assert.Greater(t, had, len(split[owners[p]]), "%s: %s gave up partition %d while it had no more than its share", s.name, owners[p], p)
			}
		}
		owners = after
	}
}

// Over many member sets, a join or a leave moves exactly the fewest
// partitions an even split allows: the partitions the members keep are the
// most they can keep, min(own, share), with the larger shares to those
// that own the most.
func TestRebalanceMovesTheFewestOverManySets(t *testing.T) {
	fewest := func(owners, members []string) int {
		n := len(owners)
		var own []int
		for _, m := range members {
			c := 0
			for _, o := range owners {
				if o == m {
					c++
				}
			}
			own = append(own, c)
		}
		slices.SortFunc(own, func(a, b int) int { return b - a })
		kept := 0
		for i, c := range own {
			share := n / len(members)
			if i < n%len(members) {
				share++
			}
			kept += min(c, share)
		}
		return n - kept
	}
	for _, n := range []int{3, 8, 12, 30} {
		for trial := range 30 {
			for m := 1; m <= 7; m++ {
				var members []string
				for i := range m {
					members = append(members, fmt.Sprintf("host-%d-%d", trial, i))
				}
				owners := ownersOf(t, Assign(members, n), n)
				joined := append(slices.Clone(members), fmt.Sprintf("new-%d", trial))
				after := ownersOf(t, Rebalance(owners, joined), n)
				if got, want := moves(owners, after), fewest(owners, joined); got != want {
					t.Fatalf("n=%d, %d members, one joins: %d partitions moved, the fewest is %d", n, m, got, want)
				}
				if m > 1 {
					left := members[trial%m+1:]
					left = append(left, members[:trial%m]...)
					after = ownersOf(t, Rebalance(owners, left), n)
					if got, want := moves(owners, after), fewest(owners, left); got != want {
						t.Fatalf("n=%d, %d members, one leaves: %d partitions moved, the fewest is %d", n, m, got, want)
					}
				}
			}
		}
	}
}

// Owners that are not members, and the partitions of a member that left,
// are free: the split gives them to the members.
func TestRebalanceFreesPartitionsOfOthers(t *testing.T) {
	split := Rebalance([]string{"gone", "a", "", "gone"}, []string{"a", "b"})
	checkEven(t, split, []string{"a", "b"}, 4)
	assert.Contains(t, split["a"], 1, "a keeps its partition")
}
