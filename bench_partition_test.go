package valkeystream_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// Measurements of partitioned topics that the benchmark program (bench/)
// cannot take: the spread of one hot topic over the masters of a cluster,
// and the times of a rebalance (a subscription's start, a join, a Close,
// a kill -9 of a subscriber process). They run for minutes and need a
// private server, so they are skipped unless VALKEYSTREAM_PARTITION_BENCH
// is set:
//
//	VALKEYSTREAM_PARTITION_BENCH=1 go test -run 'TestPartitionBench' -v -count=1 -timeout 30m .
//
// VALKEYSTREAM_PARTITION_BENCH_REPS sets the repetitions (default 5) and
// VALKEYSTREAM_PARTITION_BENCH_MESSAGES the messages per cluster run
// (default 20000). Each test logs every run and the median with the spread,
// and the round trip it was measured at.

const (
	envPartitionBench   = "VALKEYSTREAM_PARTITION_BENCH"
	envPartitionReps    = "VALKEYSTREAM_PARTITION_BENCH_REPS"
	envPartitionN       = "VALKEYSTREAM_PARTITION_BENCH_MESSAGES"
	envPartitionWorker  = "VALKEYSTREAM_PARTITION_BENCH_WORKER"
	partitionBenchGroup = "g"
)

func partitionBenchEnabled(t *testing.T) {
	t.Helper()
	if os.Getenv(envPartitionBench) == "" {
		t.Skipf("set %s=1 to run the partitioned-topic measurements", envPartitionBench)
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, name)
	require.Positive(t, n, name)
	return n
}

// pingRTT is the median of 101 PINGs.
func pingRTT(t *testing.T, client redis.UniversalClient) time.Duration {
	t.Helper()
	ds := make([]time.Duration, 101)
	for i := range ds {
		began := time.Now()
		require.NoError(t, client.Ping(context.Background()).Err())
		ds[i] = time.Since(began)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// spread is the median, the lowest and the highest of xs, and every one.
func spread[T ~int64 | ~float64](xs []T, format func(T) string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	var med T
	switch n := len(s); {
	case n == 0:
		return "no runs"
	case n%2 == 1:
		med = s[n/2]
	default:
		med = (s[n/2-1] + s[n/2]) / 2
	}
	all := make([]string, len(xs))
	for i, x := range xs {
		all[i] = format(x)
	}
	return fmt.Sprintf("median %s, %s to %s (runs: %s)", format(med), format(s[0]), format(s[len(s)-1]), strings.Join(all, ", "))
}

func fmtDuration(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
func fmtRate(r float64) string           { return fmt.Sprintf("%.0f msg/s", r) }
func fmtShare(r float64) string          { return fmt.Sprintf("%.1f%%", 100*r) }

// TestPartitionBenchCluster measures one hot topic partitioned 12 ways on
// the 3-master test cluster: the share of its entries and of the commands
// of publishing and of consuming it on each master, and the publish and
// consume rates against the same work on an unpartitioned topic. Publish:
// 64 goroutines, one message per call, each message with a key of its own.
// Consume: one Subscriber through a router whose handler returns nil.
func TestPartitionBenchCluster(t *testing.T) {
	partitionBenchEnabled(t)
	reps := envInt(t, envPartitionReps, 5)
	n := envInt(t, envPartitionN, 20000)
	const parts = 12
	c := testserver.StartCluster(t)
	ctx := context.Background()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, client.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }))
	masters := map[string]*redis.Client{}
	var order []string
	for _, addr := range c.Addrs() {
		m := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = m.Close() })
		role, err := m.Do(ctx, "ROLE").Slice()
		require.NoError(t, err)
		if role[0] == "master" {
			masters[addr] = m
			order = append(order, addr)
		}
	}
	require.Len(t, order, 3)
	t.Logf("round trip (median PING through the cluster client): %s", pingRTT(t, client).Round(time.Microsecond))

	type run struct {
		pubRate, subRate   float64
		entries            map[string]int64 // by master
		pubCmds, subCmds   map[string]int64
		pubBreak, subBreak map[string]map[string]int64
	}
	runs := map[int][]run{} // by partition count (0: plain)
	for rep := range reps {
		for _, p := range rotateInts([]int{parts, 0}, rep) {
			topic := fmt.Sprintf("hot-%d-%d-%s", rep, p, watermill.NewShortUUID())
			var partsCfg map[string]int
			streams := []string{topic}
			if p > 0 {
				partsCfg = map[string]int{topic: p}
				var err error
				streams, err = valkeystream.PartitionStreams(topic, p)
				require.NoError(t, err)
			}
			var r run
			resetStats(t, masters)
			r.pubRate = publishConcurrently(t, client, partsCfg, topic, n, 64)
			r.pubCmds, r.pubBreak = commandCalls(t, masters)
			r.entries = map[string]int64{}
			for _, s := range streams {
				owner, _, err := c.SlotOwner(ctx, s)
				require.NoError(t, err)
				l, err := client.XLen(ctx, s).Result()
				require.NoError(t, err)
				r.entries[owner] += l
			}
			resetStats(t, masters)
			r.subRate = consumeRouter(t, client, partsCfg, topic, n)
			r.subCmds, r.subBreak = commandCalls(t, masters)
			runs[p] = append(runs[p], r)
			t.Logf("rep %d, %2d partitions: publish %s, consume %s; entries %s; publish commands %s; consume commands %s",
				rep+1, p, fmtRate(r.pubRate), fmtRate(r.subRate),
				shares(order, r.entries), shares(order, r.pubCmds), shares(order, r.subCmds))
			if rep == 0 {
				t.Logf("  publish commands by master: %s", breakdown(order, r.pubBreak))
				t.Logf("  consume commands by master: %s", breakdown(order, r.subBreak))
			}
			for _, s := range streams { // one slot each
				require.NoError(t, client.Del(ctx, s).Err())
			}
		}
	}
	for _, p := range []int{parts, 0} {
		rs := runs[p]
		pub, sub := make([]float64, len(rs)), make([]float64, len(rs))
		for i, r := range rs {
			pub[i], sub[i] = r.pubRate, r.subRate
		}
		t.Logf("%2d partitions: publish %s", p, spread(pub, fmtRate))
		t.Logf("%2d partitions: consume %s", p, spread(sub, fmtRate))
		for _, what := range []string{"entries", "publish commands", "consume commands"} {
			for _, m := range order {
				xs := make([]float64, len(rs))
				for i, r := range rs {
					of := map[string]map[string]int64{"entries": r.entries, "publish commands": r.pubCmds, "consume commands": r.subCmds}[what]
					xs[i] = share(of, m)
				}
				t.Logf("%2d partitions: %s on master %s: %s", p, what, m, spread(xs, fmtShare))
			}
		}
	}
	pubP, pubPlain, subP, subPlain := make([]float64, reps), make([]float64, reps), make([]float64, reps), make([]float64, reps)
	for i := range reps {
		pubP[i], pubPlain[i] = runs[parts][i].pubRate, runs[0][i].pubRate
		subP[i], subPlain[i] = runs[parts][i].subRate, runs[0][i].subRate
	}
	ratios := func(a, b []float64) []float64 {
		out := make([]float64, len(a))
		for i := range a {
			out[i] = a[i] / b[i]
		}
		return out
	}
	fmtRatio := func(r float64) string { return fmt.Sprintf("%.2f×", r) }
	t.Logf("partitioned / plain, paired by repetition: publish %s; consume %s",
		spread(ratios(pubP, pubPlain), fmtRatio), spread(ratios(subP, subPlain), fmtRatio))
}

func rotateInts(xs []int, k int) []int {
	k %= len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}

func resetStats(t *testing.T, masters map[string]*redis.Client) {
	t.Helper()
	for _, m := range masters {
		require.NoError(t, m.ConfigResetStat(context.Background()).Err())
	}
}

// adminCommands are left out of the command counts: the test's own and the
// cluster client's upkeep.
var adminCommands = map[string]bool{
	"info": true, "config": true, "cluster": true, "ping": true, "command": true,
	"client": true, "hello": true, "readonly": true, "select": true, "role": true,
}

// commandCalls returns each master's calls since its last CONFIG RESETSTAT
// (INFO commandstats, without adminCommands), and by command.
func commandCalls(t *testing.T, masters map[string]*redis.Client) (map[string]int64, map[string]map[string]int64) {
	t.Helper()
	total, by := map[string]int64{}, map[string]map[string]int64{}
	for addr, m := range masters {
		info, err := m.Info(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		by[addr] = map[string]int64{}
		for line := range strings.SplitSeq(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			name = strings.TrimPrefix(name, "cmdstat_")
			if adminCommands[strings.Split(name, "|")[0]] {
				continue
			}
			for field := range strings.SplitSeq(rest, ",") {
				if v, ok := strings.CutPrefix(field, "calls="); ok {
					calls, err := strconv.ParseInt(v, 10, 64)
					require.NoError(t, err)
					total[addr] += calls
					by[addr][name] += calls
				}
			}
		}
	}
	return total, by
}

func share(of map[string]int64, m string) float64 {
	var sum int64
	for _, v := range of {
		sum += v
	}
	if sum == 0 {
		return 0
	}
	return float64(of[m]) / float64(sum)
}

func shares(order []string, of map[string]int64) string {
	parts := make([]string, len(order))
	for i, m := range order {
		parts[i] = fmt.Sprintf("%d (%s)", of[m], fmtShare(share(of, m)))
	}
	return strings.Join(parts, " / ")
}

func breakdown(order []string, by map[string]map[string]int64) string {
	var out []string
	for _, m := range order {
		names := make([]string, 0, len(by[m]))
		for name := range by[m] {
			names = append(names, name)
		}
		sort.Slice(names, func(i, j int) bool { return by[m][names[i]] > by[m][names[j]] })
		cells := make([]string, len(names))
		for i, name := range names {
			cells[i] = fmt.Sprintf("%s=%d", name, by[m][name])
		}
		out = append(out, m+": "+strings.Join(cells, " "))
	}
	return strings.Join(out, "; ")
}

// publishConcurrently publishes n 64-byte messages to topic from g
// goroutines, one per call, each with a partition key of its own, and
// returns the rate.
func publishConcurrently(t *testing.T, client redis.UniversalClient, parts map[string]int, topic string, n, g int) float64 {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: parts}, nil)
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	// Declares the count and opens the connections before the clock.
	require.NoError(t, pub.Publish(topic, partitionBenchMessage(-1)))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, g)
	began := time.Now()
	for range g {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := pub.Publish(topic, partitionBenchMessage(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	close(errs)
	require.NoError(t, <-errs)
	return float64(n) / elapsed.Seconds()
}

// partitionBenchMessage is message i: a 64-byte payload starting with i, and a
// partition key of its own.
func partitionBenchMessage(i int) *message.Message {
	payload := []byte(fmt.Sprintf("%-64d", i))
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(valkeystream.MetadataPartitionKey, "key-"+strconv.Itoa(i))
	return m
}

// consumeRouter reads topic's n messages (and the one of -1 the publisher
// sent first) with one Subscriber through a router, and returns the rate
// from Router.Run to the last one handled.
func consumeRouter(t *testing.T, client redis.UniversalClient, parts map[string]int, topic string, n int) float64 {
	t.Helper()
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: partitionBenchGroup, Consumer: "bench", Start: valkeystream.StartHead, Partitions: parts,
	}, nil)
	require.NoError(t, err)
	defer func() { _ = sub.Close() }()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	seen := make([]atomic.Bool, n)
	var left atomic.Int64
	left.Store(int64(n))
	done := make(chan struct{})
	var last atomic.Int64
	router.AddNoPublisherHandler("bench", topic, sub, func(msg *message.Message) error {
		i, err := strconv.Atoi(strings.TrimSpace(string(msg.Payload)))
		if err != nil || i < 0 || i >= n {
			return nil
		}
		if !seen[i].Swap(true) {
			last.Store(time.Now().UnixNano())
			if left.Add(-1) == 0 {
				close(done)
			}
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	began := time.Now()
	go func() { ran <- router.Run(ctx) }()
	select {
	case <-done:
	case err := <-ran:
		t.Fatalf("the router stopped: %v", err)
	case <-time.After(5 * time.Minute):
		t.Fatalf("%d of %d messages not handled", left.Load(), n)
	}
	elapsed := time.Unix(0, last.Load()).Sub(began)
	require.NoError(t, router.Close())
	<-ran
	return float64(n) / elapsed.Seconds()
}

// handledAt is when a subscription handled a message of a partition.
type handledAt struct {
	at   time.Time
	part int
}

// partitionReader reads a subscription's channel, Acks every message and
// keeps when it handled each and of which partition.
type partitionReader struct {
	mu     sync.Mutex
	events []handledAt
	done   chan struct{}
}

func readPartitions(msgs <-chan *message.Message) *partitionReader {
	r := &partitionReader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for msg := range msgs {
			p, _ := strconv.Atoi(msg.Metadata.Get(valkeystream.MetadataPartition))
			now := time.Now()
			msg.Ack()
			r.mu.Lock()
			r.events = append(r.events, handledAt{now, p})
			r.mu.Unlock()
		}
	}()
	return r
}

// first waits up to bound for a message handled at since or later of a
// partition in parts (any, when nil), and returns when it was handled.
func (r *partitionReader) first(t *testing.T, since time.Time, parts []int, bound time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		r.mu.Lock()
		for _, e := range r.events {
			if !e.at.Before(since) && (parts == nil || slices.Contains(parts, e.part)) {
				r.mu.Unlock()
				return e.at
			}
		}
		r.events = slices.DeleteFunc(r.events, func(e handledAt) bool { return e.at.Before(since) })
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no message of partitions %v handled within %s", parts, bound)
		}
		time.Sleep(time.Millisecond) // the poll of a wait for a handling
	}
}

// ownedOf returns what the Subscriber's one subscription owns.
func ownedOf(sub *valkeystream.Subscriber) []int {
	for _, st := range sub.Subscriptions() {
		if !st.Ended {
			return st.Owned
		}
	}
	return nil
}

// waitOwned waits up to bound until sub owns exactly want partitions, and
// has for two beats, and returns them.
func waitOwned(t *testing.T, sub *valkeystream.Subscriber, want int, beat, bound time.Duration) []int {
	t.Helper()
	deadline := time.Now().Add(bound)
	var since time.Time
	for {
		owned := ownedOf(sub)
		switch {
		case len(owned) != want:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= 2*beat:
			return owned
		}
		if time.Now().After(deadline) {
			t.Fatalf("the subscription owns %v, not %d partitions, after %s", owned, want, bound)
		}
		time.Sleep(time.Millisecond) // the poll of a wait for the ownership
	}
}

// TestPartitionBenchRebalance measures, on a topic of 8 partitions that a
// publisher keeps busy (one message per partition every 2 ms), at
// PartitionOwnerTTL 2 s and at the default 10 s:
//
//   - start: from a subscription's Subscribe call (the first of its group)
//     until it handles its first entry;
//   - join: from a second subscription's Subscribe until it handles its
//     first entry;
//   - close: from the second's Close until the first handles an entry of a
//     partition the second owned;
//   - kill: from a kill -9 of a subscriber process (this test binary,
//     re-run as TestPartitionBenchWorker) that owned half the partitions
//     until the first subscription handles an entry of one of them.
//
// The resolution is the publisher's period, 2 ms.
func TestPartitionBenchRebalance(t *testing.T) {
	partitionBenchEnabled(t)
	reps := envInt(t, envPartitionReps, 5)
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	t.Logf("server %s %s at %s; round trip (median PING): %s", srv.Name(), srv.Version(), srv.Addr(), pingRTT(t, client).Round(time.Microsecond))
	for _, ttl := range []time.Duration{2 * time.Second, valkeystream.DefaultPartitionOwnerTTL} {
		t.Run("ttl-"+ttl.String(), func(t *testing.T) {
			var start, join, closeTime, closeCall, kill []time.Duration
			for rep := range reps {
				s, j, cl, cc, k := rebalanceOnce(t, srv.Addr(), client, ttl)
				start, join, closeTime, closeCall, kill = append(start, s), append(join, j), append(closeTime, cl), append(closeCall, cc), append(kill, k)
				t.Logf("rep %d: start %s, join %s, close %s (Close returned in %s), kill -9 %s",
					rep+1, fmtDuration(s), fmtDuration(j), fmtDuration(cl), fmtDuration(cc), fmtDuration(k))
			}
			t.Logf("TTL %s (beat %s): start %s", ttl, ttl/20, spread(start, fmtDuration))
			t.Logf("TTL %s: join %s", ttl, spread(join, fmtDuration))
			t.Logf("TTL %s: close %s; Close call %s", ttl, spread(closeTime, fmtDuration), spread(closeCall, fmtDuration))
			t.Logf("TTL %s: kill -9 %s (target TTL + 1 s = %s)", ttl, spread(kill, fmtDuration), ttl+time.Second)
		})
	}
}

const rebalanceParts = 8

func rebalanceOnce(t *testing.T, addr string, client *redis.Client, ttl time.Duration) (start, join, closeTime, closeCall, kill time.Duration) {
	t.Helper()
	topic := "rebalance-" + watermill.NewShortUUID()
	parts := map[string]int{topic: rebalanceParts}
	beat := ttl / 20
	keys := make([]string, rebalanceParts) // a key of each partition
	for i := 0; slices.Contains(keys, ""); i++ {
		k := "key-" + strconv.Itoa(i)
		if p := valkeystream.PartitionOf(k, rebalanceParts); keys[p] == "" {
			keys[p] = k
		}
	}
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: parts}, nil)
	require.NoError(t, err)
	defer func() { _ = pub.Close() }()
	stopPub := make(chan struct{})
	pubDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		seq := 0
		for {
			select {
			case <-stopPub:
				pubDone <- nil
				return
			case <-tick.C:
			}
			msgs := make([]*message.Message, len(keys))
			for i, k := range keys {
				msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(seq)))
				msgs[i].Metadata.Set(valkeystream.MetadataPartitionKey, k)
				seq++
			}
			if err := pub.Publish(topic, msgs...); err != nil {
				pubDone <- err
				return
			}
		}
	}()
	defer func() {
		close(stopPub)
		require.NoError(t, <-pubDone)
		streams, _ := valkeystream.PartitionStreams(topic, rebalanceParts)
		_ = client.Del(context.Background(), streams...).Err()
	}()
	time.Sleep(50 * time.Millisecond) // the topic is busy before anyone subscribes

	newSub := func(consumer string) *valkeystream.Subscriber {
		sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
			Client: client, ConsumerGroup: partitionBenchGroup, Consumer: consumer, Start: valkeystream.StartHead,
			Partitions: parts, PartitionOwnerTTL: ttl,
		}, nil)
		require.NoError(t, err)
		return sub
	}
	ctx := context.Background()
	bound := 3*ttl + 10*time.Second

	a := newSub("a")
	defer func() { _ = a.Close() }()
	t0 := time.Now()
	msgsA, err := a.Subscribe(ctx, topic)
	require.NoError(t, err)
	readerA := readPartitions(msgsA)
	start = readerA.first(t, t0, nil, bound).Sub(t0)
	waitOwned(t, a, rebalanceParts, beat, bound)

	b := newSub("b")
	t0 = time.Now()
	msgsB, err := b.Subscribe(ctx, topic)
	require.NoError(t, err)
	readerB := readPartitions(msgsB)
	join = readerB.first(t, t0, nil, bound).Sub(t0)
	ownedB := waitOwned(t, b, rebalanceParts/2, beat, bound)
	waitOwned(t, a, rebalanceParts/2, beat, bound)

	t0 = time.Now()
	require.NoError(t, b.Close())
	closeCall = time.Since(t0)
	closeTime = readerA.first(t, t0, ownedB, bound).Sub(t0)
	<-readerB.done
	waitOwned(t, a, rebalanceParts, beat, bound)

	worker := startPartitionWorker(t, addr, topic, ttl)
	ownedA := waitOwned(t, a, rebalanceParts/2, beat, bound)
	var ownedW []int
	for p := range rebalanceParts {
		if !slices.Contains(ownedA, p) {
			ownedW = append(ownedW, p)
		}
	}
	time.Sleep(2 * beat) // the time is the scenario: the split settles before the kill
	t0 = time.Now()
	require.NoError(t, worker.Process.Kill()) // SIGKILL
	kill = readerA.first(t, t0, ownedW, bound).Sub(t0)
	_ = worker.Wait()
	return start, join, closeTime, closeCall, kill
}

// startPartitionWorker runs TestPartitionBenchWorker in a child process of
// this test binary, subscribed to topic, and returns once it subscribed.
func startPartitionWorker(t *testing.T, addr, topic string, ttl time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPartitionBenchWorker$", "-test.count=1")
	cmd.Env = append(os.Environ(), envPartitionWorker+"="+strings.Join([]string{addr, topic, ttl.String()}, ","))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if lines.Text() == "subscribed" {
			go func() {
				for lines.Scan() { //nolint:revive // drain
				}
			}()
			return cmd
		}
	}
	t.Fatalf("the worker ended before it subscribed: %v", lines.Err())
	return nil
}

// TestPartitionBenchWorker is the subscriber process of
// TestPartitionBenchRebalance's kill -9: it subscribes as consumer
// "worker" and Acks every message until it is killed (or 5 minutes pass).
func TestPartitionBenchWorker(t *testing.T) {
	spec := os.Getenv(envPartitionWorker)
	if spec == "" {
		t.Skip("the child process of TestPartitionBenchRebalance")
	}
	f := strings.Split(spec, ",")
	require.Len(t, f, 3)
	ttl, err := time.ParseDuration(f[2])
	require.NoError(t, err)
	client := redis.NewClient(&redis.Options{Addr: f[0]})
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: partitionBenchGroup, Consumer: "worker", Start: valkeystream.StartHead,
		Partitions: map[string]int{f[1]: rebalanceParts}, PartitionOwnerTTL: ttl,
	}, nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), f[1])
	require.NoError(t, err)
	fmt.Println("subscribed")
	r := readPartitions(msgs)
	select {
	case <-r.done:
	case <-time.After(5 * time.Minute):
	}
}
