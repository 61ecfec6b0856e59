package partition

import (
	"cmp"
	"slices"
	"strconv"
)

// Assign splits n partitions among members from scratch: Rebalance with no
// partition owned. It depends on nothing but the set of members and n.
func Assign(members []string, n int) map[string][]int {
	return Rebalance(make([]string, n), members)
}

// Rebalance splits the len(owners) partitions among members, where
// owners[p] is the member that owns partition p now ("" for none), moving
// as few partitions as an even split allows: every partition goes to one
// member, each member gets n/len(members) of them or one more, and no
// split that is even keeps more partitions with their owners. It depends on
// nothing but the set of members (order and repeats do not matter) and
// owners, so every subscription of a group that reads the same members and
// owner records computes the same split, with nobody to coordinate it.
// Partitions of owners that are not members are free.
//
// The rule:
//  1. The n%len(members) members that own the most partitions now (ties:
//     by name, ascending) may have n/len(members)+1; the others
//     n/len(members).
//  2. A member keeps as many of its partitions as it may have: those of
//     the highest weight w(m, p) for it (below).
//  3. The partitions left go, pair by pair in order of falling weight
//     (ties: member, then partition, ascending), to the member of the pair
//     while it has fewer than it may have.
//
// The weight w(m, p) of member m for partition p is the FNV-1a 64-bit hash
// of m's bytes, a zero byte and p in decimal, mixed by the SplitMix64
// finaliser: a rendezvous hash, so that from scratch each member gets the
// partitions that weigh most for it, and the split does not follow the
// order of the names.
//
// So when a member joins, each of the others gives up only what it has
// beyond its new share, and the newcomer gets those; when one leaves (or
// its record lapses), only its partitions move. A split that already is
// even is returned as it is.
//
// The map has every member, with its partitions in ascending order (an
// empty list when there are more members than partitions); it is empty
// when members is.
func Rebalance(owners []string, members []string) map[string][]int {
	n := len(owners)
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	out := make(map[string][]int, len(ms))
	if len(ms) == 0 {
		return out
	}
	index := make(map[string]int, len(ms))
	for i, m := range ms {
		index[m] = i
		out[m] = []int{}
	}
	owned := make([][]int, len(ms))
	for p, o := range owners {
		if i, ok := index[o]; ok && o != "" {
			owned[i] = append(owned[i], p)
		}
	}

	// 1. The shares: one more for those that own the most.
	base, extra := n/len(ms), n%len(ms)
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(len(owned[b]), len(owned[a])) })
	share := make([]int, len(ms))
	for rank, i := range order {
		share[i] = base
		if rank < extra {
			share[i]++
		}
	}

	// 2. Each keeps what weighs most for it, up to its share.
	taken := make([]bool, n)
	counts := make([]int, len(ms))
	for i, ps := range owned {
		m := ms[i]
		slices.SortFunc(ps, func(a, b int) int {
			if c := cmp.Compare(weight(m, b), weight(m, a)); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		for _, p := range ps[:min(len(ps), share[i])] {
			taken[p] = true
			out[m] = append(out[m], p)
			counts[i]++
		}
	}

	// 3. The rest by falling weight.
	type pair struct {
		w uint64
		m int // index in ms
		p int
	}
	var pairs []pair
	for p := range n {
		if taken[p] {
			continue
		}
		for i, m := range ms {
			if counts[i] < share[i] {
				pairs = append(pairs, pair{w: weight(m, p), m: i, p: p})
			}
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := cmp.Compare(b.w, a.w); c != 0 {
			return c
		}
		if c := cmp.Compare(a.m, b.m); c != 0 {
			return c
		}
		return cmp.Compare(a.p, b.p)
	})
	for _, pr := range pairs {
		if taken[pr.p] || counts[pr.m] >= share[pr.m] {
			continue
		}
		taken[pr.p] = true
		counts[pr.m]++
		out[ms[pr.m]] = append(out[ms[pr.m]], pr.p)
	}
	for _, ps := range out {
		slices.Sort(ps)
	}
	return out
}

// weight is the rendezvous weight of member m for partition p.
func weight(m string, p int) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for _, b := range []byte(m + "\x00" + strconv.Itoa(p)) {
		h ^= uint64(b)
		h *= prime64
	}
	// SplitMix64's finaliser: FNV's high bits mix poorly over keys that
	// differ in their last bytes.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
