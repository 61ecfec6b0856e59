package partition

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestNewLayoutRefusesBracesAndBadCounts(t *testing.T) {
	for _, tt := range []struct {
		stream string
		n      int
		want   string
	}{
		{"{orders}", 4, "brace"},
		{"orders}", 4, "brace"},
		{"", 4, "empty"},
		{"orders", 0, "1 to 1024"},
		{"orders", MaxPartitions + 1, "1 to 1024"},
	} {
		_, err := NewLayout(tt.stream, tt.n)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewLayout(%q, %d) = %v, want an error that says %q", tt.stream, tt.n, err, tt.want)
		}
	}
}

func TestLayoutNamesReadableKeysInTheirPartitionsSlot(t *testing.T) {
	l, err := NewLayout("orders", 12)
	require.NoError(t, err)
	assert.Equal(t, 12, l.N())
	assert.Equal(t, "orders", l.Topic())
	for i := range l.N() {
		k := l.Keys(i, "billing:eu")
		prefix := fmt.Sprintf("orders:p%d{orders#%d.", i, i)
		assert.True(t, strings.HasPrefix(k.Stream, prefix), "stream key %q begins with %q", k.Stream, prefix)
		assert.Equal(t, k.Stream, l.Stream(i))
		assert.Equal(t, k.Stream+":owner:billing%3Aeu", k.Owner)
		assert.Equal(t, k.Stream+":epoch:billing%3Aeu", k.Epoch)
		for _, key := range []string{k.Stream, k.Owner, k.Epoch} {
			assert.Equal(t, l.Slot(i), KeySlot(key), "key %q is in the slot of partition %d", key, i)
		}
		lo, hi := SlotRange(i, 12)
		assert.True(t, lo <= l.Slot(i) && l.Slot(i) < hi, "partition %d in slot %d, want [%d, %d)", i, l.Slot(i), lo, hi)
	}
	assert.Equal(t, l.Streams()[3], l.Stream(3))
	assert.NotEqual(t, l.Keys(0, "a:b").Owner, l.Keys(0, "a%3Ab").Owner, "two groups must not share a key")
	assert.Equal(t, "orders:members:billing%3Aeu", l.MembersKey("billing:eu"))
	assert.Equal(t, "orders:partitions", DeclarationKey("orders"))
}

// Every count up to the largest puts each partition in its own range of
// slots: the partitions spread evenly over the slots. (How quickly a layout
// is computed: BenchmarkNewLayout.)
func TestLayoutSpreadsOverTheSlotsForEveryCount(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 8, 12, 16, 100, 333, MaxPartitions} {
		l, err := NewLayout("topic-with-a-longer-name", n)
		require.NoError(t, err)
		prev := -1
		for i := range n {
			s := l.Slot(i)
			if s <= prev {
				t.Fatalf("n=%d: partition %d in slot %d, not above partition %d's %d", n, i, s, i-1, prev)
			}
			lo, hi := SlotRange(i, n)
			if s < lo || s >= hi {
				t.Fatalf("n=%d: partition %d in slot %d, want [%d, %d)", n, i, s, lo, hi)
			}
			prev = s
		}
	}
}

// BenchmarkNewLayout computes the layout of a few counts, the largest
// included, which every Publisher and Subscriber of such a topic does once.
func BenchmarkNewLayout(b *testing.B) {
	for _, n := range []int{16, 256, MaxPartitions} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := NewLayout("topic-with-a-longer-name", n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// On a real cluster: CLUSTER KEYSLOT agrees with KeySlot, every key of a
// partition is in one slot, and 12 partitions lie 4/4/4 on the 3 masters.
func TestLayoutOnACluster(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = client.Close() })

	for _, key := range []string{"foo", "bar", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "héllo"} {
		got, err := client.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(KeySlot(key)), got, "CLUSTER KEYSLOT %q", key)
	}

	l, err := NewLayout("orders", 12)
	require.NoError(t, err)
	perMaster := map[string]int{}
	for i := range l.N() {
		k := l.Keys(i, "g")
		for _, key := range []string{k.Stream, k.Owner, k.Epoch} {
			got, err := client.ClusterKeySlot(ctx, key).Result()
			require.NoError(t, err)
			assert.Equal(t, int64(l.Slot(i)), got, "CLUSTER KEYSLOT %q (partition %d)", key, i)
		}
		master, _, err := c.SlotOwner(ctx, k.Stream)
		require.NoError(t, err)
		perMaster[master]++
		// One call that touches every key of the partition works only when
		// they share a slot.
		require.NoError(t, client.Eval(ctx, "redis.call('INCR', KEYS[3]); redis.call('SET', KEYS[2], 'x'); return redis.call('XADD', KEYS[1], '*', 'f', 'v')",
			[]string{k.Stream, k.Owner, k.Epoch}).Err(), "partition %d", i)
	}
	assert.Len(t, perMaster, 3)
	for m, n := range perMaster {
		assert.Equal(t, 4, n, "partitions on master %s", m)
	}
}

func TestDeclareDetectsAnotherCount(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testserver.Start(t).Addr()})
	t.Cleanup(func() { _ = client.Close() })

	l8, err := NewLayout("orders", 8)
	require.NoError(t, err)
	require.NoError(t, l8.Declare(ctx, client))
	require.NoError(t, l8.Declare(ctx, client), "the same count again")
	assert.Equal(t, "8", client.Get(ctx, "orders:partitions").Val())
	assert.Equal(t, time.Duration(-1), client.PTTL(ctx, "orders:partitions").Val(), "the declaration has no TTL")

	l12, err := NewLayout("orders", 12)
	require.NoError(t, err)
	err = l12.Declare(ctx, client)
	var mismatch *CountMismatchError
	require.True(t, errors.As(err, &mismatch), "got %v, want a *CountMismatchError", err)
	assert.Equal(t, CountMismatchError{Stream: "orders", Declared: 8, Asked: 12}, *mismatch)
	assert.Contains(t, err.Error(), "8 partitions, not 12")
	assert.Equal(t, "8", client.Get(ctx, "orders:partitions").Val(), "the first declaration stands")

	require.NoError(t, client.Set(ctx, "bad:partitions", "many", 0).Err())
	lb, err := NewLayout("bad", 2)
	require.NoError(t, err)
	assert.ErrorContains(t, lb.Declare(ctx, client), "not a partition count")
}

// The tag of each partition is the first stream#i.j, j = 0, 1, ..., whose
// slot lies in the partition's range, as docs/partitions.md says producers
// of other languages compute it: found here by hashing each whole
// candidate, against the layout's faster search.
func TestLayoutTagsAreTheFirstInRange(t *testing.T) {
	first := func(stream string, i, n int) string {
		lo, hi := SlotRange(i, n)
		for j := 0; ; j++ {
			tag := fmt.Sprintf("%s#%d.%d", stream, i, j)
			if s := KeySlot(tag); lo <= s && s < hi {
				return tag
			}
		}
	}
	for _, n := range []int{1, 2, 3, 7, 8, 12, 16, 100, MaxPartitions} {
		l, err := NewLayout("orders", n)
		require.NoError(t, err)
		for _, i := range []int{0, min(1, n-1), n / 2, n - 1} {
			assert.Equal(t, first("orders", i, n), l.Tag(i), "n=%d, partition %d", n, i)
		}
	}
	// The examples of docs/partitions.md and docs/cli.md.
	l, err := NewLayout("orders", 12)
	require.NoError(t, err)
	assert.Equal(t, "orders:p3{orders#3.22}", l.Stream(3))
	l, err = NewLayout("shop:orders", 4)
	require.NoError(t, err)
	assert.Equal(t, []string{"shop:orders:p0{shop:orders#0.3}", "shop:orders:p1{shop:orders#1.21}",
		"shop:orders:p2{shop:orders#2.3}", "shop:orders:p3{shop:orders#3.21}"}, l.Streams())
	assert.Equal(t, []int{1949, 5980, 10749, 14900}, []int{l.Slot(0), l.Slot(1), l.Slot(2), l.Slot(3)})
}
