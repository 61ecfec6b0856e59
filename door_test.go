package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

func TestGroupDoorRestartStormHasNoErrors(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := e.subscriber("storm", fmt.Sprintf("c%d", i))
			_, err := sub.Subscribe(context.Background(), e.topic)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	groups, err := e.client.XInfoGroups(context.Background(), e.topic).Result()
	require.NoError(t, err)
	require.Len(t, groups, 1)
	assert.Equal(t, "storm", groups[0].Name)
}

func TestGroupDoorRefusesWrongType(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	require.NoError(t, e.client.Set(context.Background(), e.topic, "not a stream", 0).Err())
	sub := e.subscriber("g", "c")

	_, err := sub.Subscribe(context.Background(), e.topic)
	require.Error(t, err)
	var doorErr *valkeystream.GroupCreateError
	require.ErrorAs(t, err, &doorErr)
	assert.Equal(t, e.topic, doorErr.Key)
	assert.Equal(t, "g", doorErr.Group)
	for _, want := range []string{e.topic, `"g"`, "WRONGTYPE"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.ErrorContains(t, sub.SubscribeInitialize(e.topic), "WRONGTYPE")
	// The door never deletes: the key is untouched.
	assert.Equal(t, "not a stream", e.client.Get(context.Background(), e.topic).Val())
}

func TestGroupDoorCreatesStreamBeforeAnyWriter(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := e.subscriber("g", "c")
	require.NoError(t, sub.SubscribeInitialize(e.topic))
	typ, err := e.client.Type(context.Background(), e.topic).Result()
	require.NoError(t, err)
	assert.Equal(t, "stream", typ)
}

func TestDeclaredStart(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	old := e.publish(2)

	newSub := e.subscriber("from-new", "c", func(c *valkeystream.SubscriberConfig) { c.Start = valkeystream.StartNew })
	headSub := e.subscriber("from-head", "c")
	newMsgs := e.subscribe(newSub)
	headMsgs := e.subscribe(headSub)
	fresh := e.publish(1)

	assert.Equal(t, uuidsOf(fresh), receiveAll(t, newMsgs, 1), "StartNew must skip entries older than the group")
	expectNothing(t, newMsgs, 200*time.Millisecond)
	assert.Equal(t, append(uuidsOf(old), uuidsOf(fresh)...), receiveAll(t, headMsgs, 3), "StartHead must replay the stream")

	// An existing group keeps its position whatever a later subscriber declares.
	require.NoError(t, newSub.Close())
	again := e.subscriber("from-new", "c") // declares StartHead
	againMsgs := e.subscribe(again)
	expectNothing(t, againMsgs, 300*time.Millisecond)
}

// limitedSubscriber returns a group Subscriber whose client logs in as a
// user with every permission, then the ACL rules deny (e.g. "-xgroup").
func limitedSubscriber(t *testing.T, e *env, user string, deny ...string) *valkeystream.Subscriber {
	t.Helper()
	return limitedSubscriberLogging(t, e, user, nil, deny...)
}

// limitedSubscriberLogging is limitedSubscriber with a logger.
func limitedSubscriberLogging(t *testing.T, e *env, user string, logger watermill.LoggerAdapter, deny ...string) *valkeystream.Subscriber {
	t.Helper()
	ctx := context.Background()
	args := []any{"ACL", "SETUSER", user, "on", ">secret", "~*", "+@all"}
	for _, rule := range deny {
		args = append(args, rule)
	}
	require.NoError(t, e.client.Do(ctx, args...).Err())
	t.Cleanup(func() { _ = e.client.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	limited := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), Username: user, Password: "secret"})
	t.Cleanup(func() { _ = limited.Close() })
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: limited, ConsumerGroup: "g", Start: valkeystream.StartNew}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func TestSubscribeFailsWhenScriptsAreNotAllowed(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := limitedSubscriber(t, e, "no-scripts", "-@scripting")

	_, err := sub.Subscribe(context.Background(), e.topic)
	require.Error(t, err, "a subscription that could not Nack must not start")
	assert.ErrorContains(t, err, "NOPERM")
	assert.ErrorContains(t, err, "EVALSHA")
	require.NoError(t, sub.Close())
}

// A script call that fails without a reply from the server (a connection
// lost, say) fails Subscribe with the cause, not with advice about
// permissions.
func TestSubscribeFailsWhenTheScriptCheckGetsNoReply(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	lost := errors.New("connection lost")
	client := redis.NewClient(&redis.Options{Addr: e.srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	// The door's reply comes; the scripts' replies are lost.
	client.AddHook(pipelineHook(func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			err := next(ctx, cmds)
			for _, cmd := range cmds {
				if isScript(cmd) {
					cmd.SetErr(lost)
					err = lost
				}
			}
			return err
		}
	}))
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Start: valkeystream.StartNew}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	_, err = sub.Subscribe(context.Background(), e.topic)
	require.ErrorIs(t, err, lost)
	assert.ErrorContains(t, err, "checking the subscription's scripts")
	assert.NotContains(t, err.Error(), "refused", "no reply is not a refusal")
}

func TestGroupRecreatedWhenItVanishes(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	// A short BlockTime makes the loop notice the deleted stream sooner; the
	// default works too, only slower.
	sub := e.subscriber("g", "c", func(c *valkeystream.SubscriberConfig) { c.BlockTime = 50 * time.Millisecond })
	msgs := e.subscribe(sub)
	first := e.publish(1)
	assert.Equal(t, uuidsOf(first), receiveAll(t, msgs, 1))

	require.NoError(t, e.client.Del(ctx, e.topic).Err())
	later := e.publish(1)
	assert.Equal(t, uuidsOf(later), receiveAll(t, msgs, 1), "the door runs again and the group (StartHead) replays the new stream")
	groups, err := e.client.XInfoGroups(ctx, e.topic).Result()
	require.NoError(t, err)
	require.Len(t, groups, 1)
}

func TestGroupDoorRefusesWithoutPermission(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := limitedSubscriber(t, e, "no-xgroup", "-xgroup")

	_, err := sub.Subscribe(context.Background(), e.topic)
	var doorErr *valkeystream.GroupCreateError
	require.ErrorAs(t, err, &doorErr)
	assert.ErrorContains(t, err, "NOPERM")
	assert.ErrorContains(t, err, e.topic)
	require.NoError(t, sub.Close())
}

func TestSubscribeStartsInOneRoundTrip(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	var mu sync.Mutex
	var trips [][]string // the commands of each round trip, in order
	client := newClient(t, e.srv)
	record := func(cmds ...redis.Cmder) {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		mu.Lock()
		trips = append(trips, names)
		mu.Unlock()
	}
	watchCommands(client, record)
	sub := e.subscriber("g", "c", onClient(client))
	_, err := sub.Subscribe(context.Background(), e.topic)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	// At a distance from the server each round trip of Subscribe is its
	// time: the door, the script check, the lease, whether the topic is
	// partitioned and the question which newer verbs the server has go in
	// one.
	require.NotEmpty(t, trips)
	assert.Equal(t, []string{"xgroup", "eval", "eval", "eval", "get", "command"}, trips[0])
}

func TestAFailedDoorReleasesTheLeaseItTook(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, e.client.Set(ctx, e.topic, "not a stream", 0).Err())
	sub := e.subscriber("g", "c")
	_, err := sub.Subscribe(ctx, e.topic)
	var doorErr *valkeystream.GroupCreateError
	require.ErrorAs(t, err, &doorErr)
	// The lease went in the door's round trip; a failed start gives it back
	// at once, so a Subscribe that follows the fix gets the name.
	keys, err := e.client.Keys(ctx, e.topic+":lease:*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "leases left behind")
}

func TestASecondSubscriptionTriesTheHeldBaseNameOnce(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	client := newClient(t, e.srv)
	baseLease := e.topic + ":lease:g:c"
	var tries atomic.Int64
	count := func(cmds ...redis.Cmder) {
		for _, c := range cmds {
			if args := c.Args(); isScript(c) && len(args) > 3 && args[3] == baseLease {
				tries.Add(1)
			}
		}
	}
	watchCommands(client, count)
	sub := e.subscriber("g", "c", onClient(client))
	_, err := sub.Subscribe(context.Background(), e.topic)
	require.NoError(t, err)
	_, err = sub.Subscribe(context.Background(), e.topic)
	require.NoError(t, err)
	// The first takes the base name in its opening round trip; the second
	// learns there that a sibling holds it and goes on to the next name
	// without asking again.
	assert.Equal(t, int64(2), tries.Load(), "tries of the base name's lease")
	n, err := e.client.Exists(context.Background(), baseLease, e.topic+":lease:g:c-2").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "leases held")
}
