package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// handleOnce receives one message of e.topic and runs h on it under x, as
// a router would, returning the handler's error; the message is left
// unsettled for the caller.
func (e *env) handleOnce(x *valkeystream.ExactlyOnce, h func(*message.Message, *valkeystream.Step) error) (*message.Message, error) {
	e.t.Helper()
	msgs := e.subscribe(e.subscriber("g", "c"))
	e.publish(1)
	msg := receive(e.t, msgs)
	_, err := x.Middleware(func(m *message.Message) ([]*message.Message, error) {
		step, err := valkeystream.StepOf(m.Context())
		if err != nil {
			return nil, err
		}
		return nil, h(m, step)
	})(msg)
	return msg, err
}

func TestStepAppliesEveryWriteKindWithTheAck(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	k := func(name string) string { return e.topic + ":" + name }
	require.NoError(t, e.client.Set(ctx, k("gone"), "x", 0).Err())
	require.NoError(t, e.client.Set(ctx, k("counter"), "40", 0).Err())
	require.NoError(t, e.client.HSet(ctx, k("hash"), "n", "5", "old", "x").Err())
	require.NoError(t, e.client.ZAdd(ctx, k("zset"), redis.Z{Score: 1, Member: "old"}).Err())
	require.NoError(t, e.client.SAdd(ctx, k("set"), "old").Err())
	require.NoError(t, e.client.Set(ctx, k("expiring"), "x", 0).Err())
	x := e.exactlyOnce(e.publisher())

	msg, err := e.handleOnce(x, func(m *message.Message, s *valkeystream.Step) error {
		for _, err := range []error{
			s.Set(k("string"), "value", 0),
			s.Set(k("ttl"), "value", time.Hour),
			s.Del(k("gone")),
			s.IncrBy(k("counter"), 2),
			s.IncrBy(k("new-counter"), -3),
			s.Expire(k("expiring"), time.Hour),
			s.HSet(k("hash"), "f", "v"),
			s.HIncrBy(k("hash"), "n", 10),
			s.HDel(k("hash"), "old"),
			s.ZAdd(k("zset"), 2.5, "new"),
			s.ZRem(k("zset"), "old"),
			s.SAdd(k("set"), "a", "b"),
			s.SRem(k("set"), "old"),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	msg.Ack()

	assert.Equal(t, "value", e.client.Get(ctx, k("string")).Val())
	assert.Equal(t, time.Duration(-1), e.client.TTL(ctx, k("string")).Val(), "SET without a ttl")
	assert.InDelta(t, time.Hour.Seconds(), e.client.TTL(ctx, k("ttl")).Val().Seconds(), 60)
	assert.Zero(t, e.client.Exists(ctx, k("gone")).Val())
	assert.Equal(t, "42", e.client.Get(ctx, k("counter")).Val())
	assert.Equal(t, "-3", e.client.Get(ctx, k("new-counter")).Val())
	assert.InDelta(t, time.Hour.Seconds(), e.client.TTL(ctx, k("expiring")).Val().Seconds(), 60)
	assert.Equal(t, map[string]string{"f": "v", "n": "15"}, e.client.HGetAll(ctx, k("hash")).Val())
	assert.Equal(t, []redis.Z{{Score: 2.5, Member: "new"}}, e.client.ZRangeWithScores(ctx, k("zset"), 0, -1).Val())
	assert.ElementsMatch(t, []string{"a", "b"}, e.client.SMembers(ctx, k("set")).Val())
	assert.Zero(t, e.pendingCount(e.topic, "g"), "the input is acknowledged by the step")
	st := x.Stats()
	assert.Equal(t, int64(1), st.Committed)
	assert.Equal(t, int64(13), st.StateWrites)
}

// A step whose writes the server would refuse applies none of them, the
// ones before the refused write included, and names the command and key.
func TestStepRefusedByTheServerWritesNothing(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	cases := []struct {
		name    string
		prepare func(e *env, k func(string) string)
		write   func(s *valkeystream.Step, k func(string) string) error
		want    []string // in the error
	}{
		{"a hash write to a string",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "a string", 0) },
			func(s *valkeystream.Step, k func(string) string) error { return s.HSet(k("bad"), "f", "v") },
			[]string{"WRONGTYPE", "HSET", ":bad"}},
		{"an increment of a string that is no integer",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "abc", 0) },
			func(s *valkeystream.Step, k func(string) string) error { return s.IncrBy(k("bad"), 1) },
			[]string{"INCRBY", ":bad", "not an integer"}},
		{"an increment of a value the step itself set",
			func(*env, func(string) string) {},
			func(s *valkeystream.Step, k func(string) string) error {
				if err := s.Set(k("bad"), "1.5", 0); err != nil {
					return err
				}
				return s.IncrBy(k("bad"), 1)
			},
			[]string{"INCRBY", ":bad", "not an integer"}},
		{"a hash field increment past 64 bits",
			func(e *env, k func(string) string) { e.client.HSet(ctx, k("bad"), "n", "9223372036854775000") },
			func(s *valkeystream.Step, k func(string) string) error { return s.HIncrBy(k("bad"), "n", 10_000) },
			[]string{"HINCRBY", ":bad", "overflow"}},
		{"an increment past the largest 64-bit integer",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "9223372036854775807", 0) },
			func(s *valkeystream.Step, k func(string) string) error { return s.IncrBy(k("bad"), 1) },
			[]string{"INCRBY", ":bad", "overflow"}},
		{"a second increment past the largest 64-bit integer",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "9223372036854775806", 0) },
			func(s *valkeystream.Step, k func(string) string) error {
				return errors.Join(s.IncrBy(k("bad"), 1), s.IncrBy(k("bad"), 1))
			},
			[]string{"INCRBY", ":bad", "overflow"}},
		{"an increment below the smallest 64-bit integer",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "-9223372036854775808", 0) },
			func(s *valkeystream.Step, k func(string) string) error { return s.IncrBy(k("bad"), -1) },
			[]string{"INCRBY", ":bad", "overflow"}},
		{"an increment of an integer too large for 64 bits",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "10000000000000000000", 0) },
			func(s *valkeystream.Step, k func(string) string) error {
				return s.IncrBy(k("bad"), -9000000000000000000)
			},
			[]string{"INCRBY", ":bad", "not an integer"}},
		{"an increment of an integer with a leading zero",
			func(e *env, k func(string) string) { e.client.Set(ctx, k("bad"), "007", 0) },
			func(s *valkeystream.Step, k func(string) string) error { return s.IncrBy(k("bad"), 1) },
			[]string{"INCRBY", ":bad", "not an integer"}},
		{"a set write to a sorted set",
			func(e *env, k func(string) string) { e.client.ZAdd(ctx, k("bad"), redis.Z{Score: 1, Member: "m"}) },
			func(s *valkeystream.Step, k func(string) string) error { return s.SAdd(k("bad"), "m") },
			[]string{"WRONGTYPE", "SADD", ":bad"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			k := func(name string) string { return e.topic + ":" + name }
			c.prepare(e, k)
			out := e.topic + "-out"
			pub := e.publisher()
			x := e.exactlyOnce(pub, func(c *valkeystream.ExactlyOnceConfig) { c.CommitTimeout = 200 * time.Millisecond })
			msg, err := e.handleOnce(x, func(m *message.Message, s *valkeystream.Step) error {
				o := outputOf(m)
				o.SetContext(m.Context())
				if err := pub.Publish(out, o); err != nil {
					return err
				}
				if err := s.Set(k("before"), "x", 0); err != nil {
					return err
				}
				return c.write(s, k)
			})
			require.Error(t, err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Zero(t, e.client.Exists(ctx, k("before")).Val(), "a write before the refused one was applied")
			assert.Empty(t, e.stored(out), "an output was written")
			assert.Equal(t, int64(1), e.pendingCount(e.topic, "g"), "the input was acknowledged")
			assert.Equal(t, int64(1), x.Stats().Failed)
			assert.Zero(t, x.Stats().StateWrites)
			msg.Nack()
		})
	}
}

// The script follows the step's own earlier writes of a key: an increment
// after a Del or a Set of an integer is not refused for what the key held
// before.
func TestStepIncrementFollowsTheStepsOwnWrites(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	k := func(name string) string { return e.topic + ":" + name }
	require.NoError(t, e.client.Set(ctx, k("a"), "not a number", 0).Err())
	require.NoError(t, e.client.HSet(ctx, k("h"), "f", "not a number").Err())
	x := e.exactlyOnce(e.publisher())
	msg, err := e.handleOnce(x, func(m *message.Message, s *valkeystream.Step) error {
		return errors.Join(
			s.Del(k("a")), s.IncrBy(k("a"), 5), s.IncrBy(k("a"), 5),
			s.Set(k("b"), "7", 0), s.IncrBy(k("b"), 1),
			s.HDel(k("h"), "f"), s.HIncrBy(k("h"), "f", 2),
		)
	})
	require.NoError(t, err)
	msg.Ack()
	assert.Equal(t, "10", e.client.Get(ctx, k("a")).Val())
	assert.Equal(t, "8", e.client.Get(ctx, k("b")).Val())
	assert.Equal(t, "2", e.client.HGet(ctx, k("h"), "f").Val())
}

// Increments up to the ends of the 64-bit range are applied as the server
// applies them: the script's check is exact there.
func TestStepIncrementsReachTheEndsOfTheRange(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	k := func(name string) string { return e.topic + ":" + name }
	start := map[string]string{
		"max-1": "9223372036854775806", "max": "9223372036854775807",
		"min+1": "-9223372036854775807", "near": "9223372036854700000", "cross": "-5",
	}
	for name, v := range start {
		require.NoError(t, e.client.Set(ctx, k(name), v, 0).Err())
	}
	require.NoError(t, e.client.HSet(ctx, k("h"), "f", "-9223372036854775000").Err())
	x := e.exactlyOnce(e.publisher())
	msg, err := e.handleOnce(x, func(m *message.Message, s *valkeystream.Step) error {
		return errors.Join(
			s.IncrBy(k("max-1"), 1), s.IncrBy(k("max"), -1), s.IncrBy(k("min+1"), -1),
			s.IncrBy(k("near"), 75807), s.IncrBy(k("cross"), 1_000_000_005),
			s.IncrBy(k("new"), -9223372036854775808),
			s.HIncrBy(k("h"), "f", -808),
		)
	})
	require.NoError(t, err)
	msg.Ack()
	for name, want := range map[string]string{
		"max-1": "9223372036854775807", "max": "9223372036854775806", "min+1": "-9223372036854775808",
		"near": "9223372036854775807", "cross": "1000000000", "new": "-9223372036854775808",
	} {
		assert.Equal(t, want, e.client.Get(ctx, k(name)).Val(), name)
	}
	assert.Equal(t, "-9223372036854775808", e.client.HGet(ctx, k("h"), "f").Val())
}

// Writes that cannot join a step are refused when added, and add nothing.
func TestStepRefusesWritesThatCannotJoinIt(t *testing.T) {
	testserver.Parallel(t)
	_, err := valkeystream.StepOf(context.Background())
	assert.ErrorIs(t, err, valkeystream.ErrNotAtomic, "a context of no handling")

	e := newEnv(t)
	ctx := context.Background()
	k := func(name string) string { return e.topic + ":" + name }
	out := e.topic + "-out"
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	var kept *valkeystream.Step
	msg, err := e.handleOnce(x, func(m *message.Message, s *valkeystream.Step) error {
		kept = s
		assert.ErrorIs(t, s.HSet(e.topic, "f", "v"), valkeystream.ErrInvalidWrite, "the input stream")
		o := outputOf(m)
		o.SetContext(m.Context())
		require.NoError(t, pub.Publish(out, o))
		assert.ErrorIs(t, s.Del(out), valkeystream.ErrInvalidWrite, "a stream the step writes to")
		require.NoError(t, s.Set(k("s"), "v", 0))
		assert.ErrorIs(t, s.HSet(k("s"), "f", "v"), valkeystream.ErrInvalidWrite, "a string written as a hash")
		require.NoError(t, s.Del(k("any")))
		require.NoError(t, s.SAdd(k("any"), "m"), "a key deleted, then written as a set")
		assert.ErrorIs(t, s.ZAdd(k("any"), 1, "m"), valkeystream.ErrInvalidWrite, "then as a sorted set")
		assert.ErrorIs(t, s.Set(k("x"), "v", -time.Second), valkeystream.ErrInvalidWrite)
		assert.ErrorIs(t, s.Expire(k("x"), 0), valkeystream.ErrInvalidWrite)
		assert.ErrorIs(t, s.HDel(k("x")), valkeystream.ErrInvalidWrite)
		return nil
	})
	require.NoError(t, err)
	msg.Ack()
	assert.ErrorIs(t, kept.Set(k("late"), "v", 0), valkeystream.ErrNotAtomic, "after the handler returned")
	assert.Equal(t, "v", e.client.Get(ctx, k("s")).Val())
	assert.Equal(t, []string{"m"}, e.client.SMembers(ctx, k("any")).Val())
	assert.Zero(t, e.client.Exists(ctx, k("x"), k("late")).Val())
	assert.Len(t, e.stored(out), 1)
	assert.Equal(t, int64(3), x.Stats().StateWrites)
}

// A step superseded (the input taken over by a peer while the handler ran)
// applies none of its writes; the peer's handling applies its own once.
func TestStepWritesNothingForADeliveryThatIsNoLongerItsOwn(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	counter := e.topic + ":handled"
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	e.runTransform(sub, pub, "", func(msg *message.Message) ([]*message.Message, error) {
		s, err := valkeystream.StepOf(msg.Context())
		if err != nil {
			return nil, err
		}
		if err := s.IncrBy(counter, 1); err != nil {
			return nil, err
		}
		id := msg.Metadata.Get(valkeystream.MetadataEntryID)
		return nil, e.client.XClaim(ctx, &redis.XClaimArgs{Stream: e.topic, Group: "g", Consumer: "peer", Messages: []string{id}}).Err()
	}, x.Middleware)
	e.publish(1)
	waitUntil(t, "the step superseded", func() bool { return x.Stats().Superseded == 1 })
	assert.Zero(t, e.client.Exists(ctx, counter).Val(), "the superseded step's write was applied")
	assert.Zero(t, x.Stats().StateWrites)
	p := e.pending("g")
	require.Len(t, p, 1)
	assert.Equal(t, "peer", p[0].Consumer)
}

// Expect guards a read-modify-write: two handlings that read one version
// of a hash both try to write the next; the second step finds the version
// moved on, writes nothing, and its message comes back to read again.
func TestStepExpectGuardsAReadModifyWrite(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	account := e.topic + ":account"
	require.NoError(t, e.client.HSet(ctx, account, "balance", "100", "version", "1").Err())
	pub := e.publisher()
	x := e.exactlyOnce(pub)
	sub := e.subscriber("g", "c", fastRedelivery)
	var handlings atomic.Int64
	e.runTransform(sub, pub, "", func(msg *message.Message) ([]*message.Message, error) {
		handlings.Add(1)
		s, err := valkeystream.StepOf(msg.Context())
		if err != nil {
			return nil, err
		}
		h := e.client.HGetAll(ctx, account).Val()
		balance, _ := strconv.Atoi(h["balance"])
		version, _ := strconv.Atoi(h["version"])
		if handlings.Load() == 1 {
			// Another writer commits between this handler's read and its
			// step.
			require.NoError(t, e.client.HSet(ctx, account, "balance", "150", "version", "2").Err())
		}
		return nil, errors.Join(
			s.ExpectField(account, "version", strconv.Itoa(version)),
			s.HSet(account, "balance", strconv.Itoa(balance+10)),
			s.HSet(account, "version", strconv.Itoa(version+1)),
		)
	}, x.Middleware)
	e.publish(1)
	waitUntil(t, "committed", func() bool { return x.Stats().Committed == 1 })
	assert.Equal(t, int64(1), x.Stats().StateChanged)
	assert.Equal(t, int64(2), handlings.Load())
	assert.Equal(t, map[string]string{"balance": "160", "version": "3"}, e.client.HGetAll(ctx, account).Val())
	waitUntil(t, "nothing pending", func() bool { return e.pendingCount(e.topic, "g") == 0 })
}

func TestStepExpectFailsWithTheKeyAndWhatItHeld(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	key := e.topic + ":v"
	require.NoError(t, e.client.Set(ctx, key, "2", 0).Err())
	x := e.exactlyOnce(e.publisher())
	msg, err := e.handleOnce(x, func(m *message.Message, s *valkeystream.Step) error {
		return errors.Join(s.Expect(key, "1"), s.Set(key, "3", 0))
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, valkeystream.ErrStateChanged)
	var changed *valkeystream.StateChangedError
	require.ErrorAs(t, err, &changed)
	assert.Equal(t, valkeystream.StateChangedError{Key: key, Found: "2"}, *changed)
	assert.Equal(t, "2", e.client.Get(ctx, key).Val(), "written although the expectation failed")
	assert.Equal(t, int64(1), e.pendingCount(e.topic, "g"))
	msg.Nack()
}

// TestPartitionedStateIsReadAsTheLastStepLeftIt: on a partitioned topic a
// partition's keys, written only by its handler in its steps, are read
// consistently: each step of a partition commits before the next message
// of the partition is handed over, also across a move of partitions to a
// subscription that joins. A handler that reads a balance, adds to it and
// writes it back with no guard loses no update.
func TestPartitionedStateIsReadAsTheLastStepLeftIt(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	const partitions, accounts, perAccount = 4, 8, 25
	partitioned := func(c *valkeystream.SubscriberConfig) {
		c.Partitions = map[string]int{e.topic: partitions}
	}
	pub := e.publisher(func(c *valkeystream.PublisherConfig) {
		c.Partitions = map[string]int{e.topic: partitions}
	})
	x := e.exactlyOnce(pub)
	balance := func(account int) string { return fmt.Sprintf("%s:balance:%d", e.topic, account) }
	handler := func(msg *message.Message) ([]*message.Message, error) {
		s, err := valkeystream.StepOf(msg.Context())
		if err != nil {
			return nil, err
		}
		key := balance(mustAtoi(msg.Metadata.Get("account")))
		old, err := e.client.Get(ctx, key).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		return nil, s.Set(key, strconv.FormatInt(old+mustInt64(string(msg.Payload)), 10), 0)
	}
	e.runTransform(e.subscriber("g", "a", partitioned), pub, "", handler, x.Middleware)
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			for a := range accounts {
				m := message.NewMessage(fmt.Sprint("m-", a, "-", i), []byte(strconv.Itoa(i+1)))
				m.Metadata.Set("account", strconv.Itoa(a))
				m.Metadata.Set(valkeystream.MetadataPartitionKey, strconv.Itoa(a))
				require.NoError(t, pub.Publish(e.topic, m))
			}
		}
	}
	publish(0, perAccount/2)
	// A second subscription joins while messages flow: partitions move.
	e.runTransform(e.subscriber("g", "b", partitioned), pub, "", handler, x.Middleware)
	publish(perAccount/2, perAccount)
	waitUntil(t, "every message committed", func() bool { return x.Stats().Committed >= accounts*perAccount })
	want := strconv.Itoa(perAccount * (perAccount + 1) / 2)
	for a := range accounts {
		assert.Equal(t, want, e.client.Get(ctx, balance(a)).Val(), "account %d", a)
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

func mustInt64(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic(err)
	}
	return n
}

// A consumer cut off from the server while its handler runs loses the
// input to a peer (its hold lapses past ClaimMinIdle), and the peer's step
// commits; when the first handler returns, after the heal, its step finds
// the input no longer its own and applies none of its writes.
func TestStepOfACutOffConsumerAppliesNothingAfterAPeerTookOver(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	counter := e.topic + ":applied"
	proxy := testserver.NewProxy(t, e.srv.Addr())
	cutClient := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = cutClient.Close() })
	cutPub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: cutClient}, testLogger())
	require.NoError(t, err)
	cutX := e.exactlyOnce(cutPub)
	msgs := e.subscribe(e.subscriber("g", "cut", shortClaim, onClient(cutClient)))
	e.publish(1)
	msg := receive(t, msgs)

	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := cutX.Middleware(func(m *message.Message) ([]*message.Message, error) {
			s, err := valkeystream.StepOf(m.Context())
			if err != nil {
				return nil, err
			}
			if err := s.IncrBy(counter, 1); err != nil {
				return nil, err
			}
			close(entered)
			<-release
			return nil, nil
		})(msg)
		done <- err
	}()
	<-entered
	proxy.Cut()

	pub := e.publisher()
	x := e.exactlyOnce(pub)
	e.runTransform(e.subscriber("g", "peer", shortClaim), pub, "", func(m *message.Message) ([]*message.Message, error) {
		s, err := valkeystream.StepOf(m.Context())
		if err != nil {
			return nil, err
		}
		return nil, s.IncrBy(counter, 1)
	}, x.Middleware)
	waitUntil(t, "the peer's step committed", func() bool { return x.Stats().Committed == 1 })

	proxy.Heal()
	close(release)
	select {
	case err := <-done:
		// The step was sent after the heal, or failed on the cut
		// connection and was sent again: either way it wrote nothing.
		t.Logf("the cut-off handling returned %v; its stats %+v", err, cutX.Stats())
	case <-time.After(receiveTimeout):
		t.Fatal("the cut-off handling did not return")
	}
	msg.Ack()
	// The data, not the counters: a step sent again after a connection
	// error that finds its input acknowledged counts as committed (its
	// first try may have been), though here the peer acknowledged it.
	assert.Equal(t, "1", e.client.Get(ctx, counter).Val(), "the cut-off consumer's write was applied too")
	assert.Zero(t, e.pendingCount(e.topic, "g"))
}
