package valkeystream_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/audit"
	"github.com/echomq/valkeystream/internal/testserver"
)

// leaseKeyOf is the documented key of the lease on a consumer name (for a
// group without ':' or '%').
func leaseKeyOf(stream, group, name string) string {
	return stream + ":lease:" + group + ":" + name
}

// shortLease makes leases short, so that the tests of lapsed leases are.
func shortLease(c *valkeystream.SubscriberConfig) { c.ConsumerLeaseTTL = time.Second }

// consumerOf publishes one message, receives it on msgs and returns the
// consumer name it was delivered under.
func consumerOf(t *testing.T, e *env, msgs <-chan *message.Message) string {
	t.Helper()
	e.publish(1)
	m := receive(t, msgs)
	m.Ack()
	return m.Metadata.Get(valkeystream.MetadataConsumer)
}

func TestSameConsumerNameInOneProcessIsNeverShared(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	// Two Subscribers with clients of their own, as two components of one
	// service would have.
	other := newClient(t, e.srv)
	a := e.subscriber("g", "worker")
	b := e.subscriber("g", "worker", func(c *valkeystream.SubscriberConfig) { c.Client = other })
	ma, mb := e.subscribe(a), e.subscribe(b)
	// Which subscription a message goes to is the server's choice: publish
	// one at a time until each subscription has handled one.
	names := map[<-chan *message.Message]string{}
	for i := 0; len(names) < 2; i++ {
		require.Less(t, i, 100, "after 100 messages, one subscription still had none")
		e.publish(1)
		var m *message.Message
		var from <-chan *message.Message
		select {
		case m = <-ma:
			from = ma
		case m = <-mb:
			from = mb
		case <-time.After(receiveTimeout):
			t.Fatalf("no message within %s", receiveTimeout)
		}
		names[from] = m.Metadata.Get(valkeystream.MetadataConsumer)
		m.Ack()
	}
	assert.Equal(t, "worker", names[ma], "the first subscription has the bare name")
	assert.Equal(t, "worker-2", names[mb], "the second takes the next indexed name")
	tokA, err := e.client.Get(ctx, leaseKeyOf(e.topic, "g", "worker")).Result()
	require.NoError(t, err)
	tokB, err := e.client.Get(ctx, leaseKeyOf(e.topic, "g", "worker-2")).Result()
	require.NoError(t, err)
	assert.NotEqual(t, tokA, tokB)
}

// A holder that renews its lease is alive: the name is never taken from it,
// whoever set Consumer.
func TestConsumerNameRenewedElsewhereIsNotTaken(t *testing.T) {
	testserver.Parallel(t)
	ctx, cancel := context.WithCancel(context.Background())
	e := newEnv(t)
	key := leaseKeyOf(e.topic, "g", "worker")
	require.NoError(t, e.client.Set(ctx, key, "another-process", time.Second).Err())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the other process's renewals
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				e.client.PExpire(ctx, key, time.Second)
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	sub := e.subscriber("g", "worker", shortLease)
	assert.Equal(t, "worker-2", consumerOf(t, e, e.subscribe(sub)))
	assert.Equal(t, "another-process", e.client.Get(ctx, key).Val())
}

// A lease nobody renews belongs to a subscription that stopped without
// Close (a crash, simulated here by a lease key that nobody renews and an
// entry left pending under its name): Subscribe does not wait for it, runs
// under the next name and handles new messages while the lease is on the
// server, and takes over the entry once the lease lapses, delivered a second
// time; nothing stays pending under the old name.
func TestEntriesOfAStoppedHolderAreTakenOverOnceItsLeaseLapses(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	require.NoError(t, e.client.XGroupCreateMkStream(ctx, e.topic, "g", "0").Err())
	sent := e.publish(1)
	require.NoError(t, e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "g", Consumer: "worker", Streams: []string{e.topic, ">"}, Count: 1, Block: -1}).Err())
	key := leaseKeyOf(e.topic, "g", "worker")
	require.NoError(t, e.client.Set(ctx, key, "a-killed-process", time.Second).Err())

	start := time.Now()
	msgs := e.subscribe(e.subscriber("g", "worker", shortLease))
	subscribed := time.Since(start)
	fresh := e.publish(1)
	m := receive(t, msgs)
	newAt := time.Since(start)
	assert.Equal(t, fresh[0].UUID, m.UUID, "the new message comes first: the old one waits for the lease")
	assert.Equal(t, "a-killed-process", e.client.Get(ctx, key).Val(), "handled while the stopped holder's lease is on the server")
	assert.Equal(t, "worker-2", m.Metadata.Get(valkeystream.MetadataConsumer))
	m.Ack()

	m = receive(t, msgs)
	oldAt := time.Since(start)
	assert.Equal(t, sent[0].UUID, m.UUID)
	assert.Equal(t, "worker-2", m.Metadata.Get(valkeystream.MetadataConsumer))
	assert.Equal(t, 2, valkeystream.DeliveryCount(m), "taken over from the old name, delivered a second time")
	m.Ack()
	require.Eventually(t, func() bool {
		p, err := e.client.XPending(ctx, e.topic, "g").Result()
		return err == nil && p.Count == 0
	}, receiveTimeout, 10*time.Millisecond, "nothing may stay pending")
	t.Logf("Subscribe returned after %s; the new message was handled after %s, the stopped holder's entry after %s (its lease had 1 s left)",
		subscribed.Round(time.Millisecond), newAt.Round(time.Millisecond), oldAt.Round(time.Millisecond))
}

func TestCloseReleasesTheConsumerName(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	key := leaseKeyOf(e.topic, "g", "worker")
	first := e.subscriber("g", "worker")
	assert.Equal(t, "worker", consumerOf(t, e, e.subscribe(first)))
	require.Equal(t, int64(1), e.client.Exists(ctx, key).Val(), "a running subscription holds its name")
	require.NoError(t, first.Close())
	assert.Zero(t, e.client.Exists(ctx, key).Val(), "Close must release the name")

	// A foreign holder would make the next Subscribe wait: none is there,
	// so it takes the bare name at once.
	second := e.subscriber("g", "worker")
	assert.Equal(t, "worker", consumerOf(t, e, e.subscribe(second)))
}

// Once a subscription's channel is closed its name is free: a router closed
// and run again, or a Subscribe whose context ended and that starts again,
// gets the name back and with it what was left pending.
func TestNameIsFreeOnceTheChannelIsClosed(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	// Each round ends with the message unsettled: no grace to wait.
	sub := e.subscriber("g", "worker", func(c *valkeystream.SubscriberConfig) { c.CloseGrace = valkeystream.NoCloseGrace })
	sent := e.publish(1)
	for round := range 3 {
		subCtx, cancel := context.WithCancel(ctx)
		msgs, err := sub.Subscribe(subCtx, e.topic)
		require.NoError(t, err)
		m := receive(t, msgs)
		require.Equal(t, sent[0].UUID, m.UUID)
		require.Equal(t, "worker", m.Metadata.Get(valkeystream.MetadataConsumer), "round %d", round)
		require.Equal(t, round+1, valkeystream.DeliveryCount(m), "round %d", round)
		cancel() // not Acked: it stays pending for worker
		for range msgs {
		}
		require.Zero(t, e.client.Exists(ctx, leaseKeyOf(e.topic, "g", "worker")).Val(), "round %d: the name must be free", round)
	}
}

func TestSubscriptionThatLostItsNameStops(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	logs := newErrorLog(testLogger())
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: e.client, ConsumerGroup: "g", Consumer: "worker", Start: valkeystream.StartHead,
		ConsumerLeaseTTL: time.Second,
	}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs := e.subscribe(sub)
	require.Equal(t, "worker", consumerOf(t, e, msgs))

	// What another subscription does once the lease lapsed.
	require.NoError(t, e.client.Set(ctx, leaseKeyOf(e.topic, "g", "worker"), "the-new-holder", time.Minute).Err())
	select {
	case m, ok := <-msgs:
		require.False(t, ok, "got message %v, want the channel closed", m)
	case <-time.After(receiveTimeout):
		t.Fatalf("the subscription still runs %s after it lost its name", receiveTimeout)
	}
	assert.Contains(t, logs.first(5), "Lost the consumer name")
	require.NoError(t, sub.Close())
	assert.Equal(t, "the-new-holder", e.client.Get(ctx, leaseKeyOf(e.topic, "g", "worker")).Val(),
		"Close must not release a lease that is not its own")
}

// startWorker starts internal/crashworker (built by buildCrashWorker) on the
// env's topic with group "g" and returns it with its ledger. Closing
// stdin stops it gracefully; it is killed when the test ends.
func startWorker(t *testing.T, e *env, bin, consumer string, extra ...string) (*exec.Cmd, *audit.Reader) {
	t.Helper()
	dir := t.TempDir()
	ledger := audit.NewReader(filepath.Join(dir, "ledger"))
	logFile, err := os.Create(filepath.Join(dir, "log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = logFile.Close() })
	stdinR, stdinW, err := os.Pipe()
	require.NoError(t, err)
	args := append([]string{"-addr", e.srv.Addr(), "-topic", e.topic, "-group", "g", "-consumer", consumer,
		"-ledger", ledger.Path(), "-delay-prob", "0"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, logFile, logFile
	require.NoError(t, cmd.Start())
	_ = stdinR.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = stdinW.Close()
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("worker %s (pid %d) log:\n%s", consumer, cmd.Process.Pid, log)
		}
	})
	return cmd, ledger
}

// holderPid returns the process id in the token of the lease key, or 0.
func holderPid(e *env, key string) int {
	tok, err := e.client.Get(context.Background(), key).Result()
	if err != nil {
		return 0
	}
	parts := strings.Split(tok, ":")
	if len(parts) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[len(parts)-2])
	return pid
}

// Two processes with the same Consumer: the second takes the next name,
// and the entry the first holds stays with it, over several lease TTLs.
func TestSameConsumerNameInTwoProcessesIsNeverShared(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	bin := buildCrashWorker(t)
	key := leaseKeyOf(e.topic, "g", "worker")
	// The worker holds the one entry it reads, so that the rest come here.
	worker, _ := startWorker(t, e, bin, "worker", "-stall", "-batch", "1", "-lease-ttl", "1s")
	require.Eventually(t, func() bool { return holderPid(e, key) == worker.Process.Pid }, time.Minute, 20*time.Millisecond,
		"the worker process must lease its name")
	e.publish(1)
	require.Eventually(t, func() bool {
		p, err := e.client.XPending(context.Background(), e.topic, "g").Result()
		return err == nil && p.Consumers["worker"] == 1
	}, time.Minute, 20*time.Millisecond, "the worker process must hold an entry")

	start := time.Now()
	msgs := e.subscribe(e.subscriber("g", "worker", shortLease))
	t.Logf("Subscribe took %s", time.Since(start).Round(time.Millisecond))
	e.publish(5)
	for range 5 {
		m := receive(t, msgs)
		assert.Equal(t, "worker-2", m.Metadata.Get(valkeystream.MetadataConsumer))
		m.Ack()
	}
	// Long enough for a subscription that took over a live holder's entries
	// to have done it: three lease TTLs.
	time.Sleep(3 * time.Second)
	p, err := e.client.XPending(context.Background(), e.topic, "g").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), p.Consumers["worker"], "the worker holds its entry under its own name")
	assert.Equal(t, worker.Process.Pid, holderPid(e, key), "the name stays with the process that had it")
	assert.Equal(t, os.Getpid(), holderPid(e, leaseKeyOf(e.topic, "g", "worker-2")))
}

// Twenty rolling restarts, each under a fresh name (as pods of a Deployment
// get), each leaving entries pending: the names that left are removed once
// they hold nothing and are idle past the age, and nothing is lost.
func TestRollingRestartsWithFreshNamesLeaveOnlyLiveConsumers(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	const (
		restarts = 20
		perRun   = 5
		age      = 1500 * time.Millisecond
	)
	timings := func(c *valkeystream.SubscriberConfig) {
		c.BlockTime = 50 * time.Millisecond
		c.ClaimInterval = 100 * time.Millisecond
		c.ClaimMinIdle = 500 * time.Millisecond
		c.RemoveIdleConsumersAfter = age
		c.BatchSize = 2
		// The message in a handler's hands at Close stays pending either
		// way; waiting the default grace for it made each restart 5 s.
		c.CloseGrace = 100 * time.Millisecond
	}
	received := map[string]bool{}
	var mu sync.Mutex
	consume := func(msgs <-chan *message.Message, done chan<- struct{}) {
		defer close(done)
		for m := range msgs {
			mu.Lock()
			received[m.UUID] = true
			mu.Unlock()
			m.Ack()
		}
	}
	// A steady peer, as the other replicas of a rolling update.
	peer := e.subscriber("g", "steady", timings)
	peerDone := make(chan struct{})
	go consume(e.subscribe(peer), peerDone)

	var sent []string
	var live *valkeystream.Subscriber
	var liveMsgs <-chan *message.Message
	var held *message.Message
	liveName := ""
	for i := range restarts {
		name := fmt.Sprintf("pod-%d", i)
		sub := e.subscriber("g", name, timings)
		msgs := e.subscribe(sub)
		if live != nil {
			require.NoError(t, live.Close()) // the old pod goes after the new one is up
		}
		live, liveMsgs, liveName = sub, msgs, name
		sent = append(sent, uuidsOf(e.publish(perRun))...)
		// Handle one, and leave one in the handler's hands at Close.
		held = nil
		for _, keep := range []bool{true, false} {
			select {
			case m := <-msgs:
				mu.Lock()
				received[m.UUID] = true
				mu.Unlock()
				if keep {
					m.Ack()
				} else {
					held = m
				}
			case <-time.After(200 * time.Millisecond):
				// The peer took them.
			}
		}
	}
	// The last pod stays and consumes, as the peer does; the message its
	// handler holds fails and comes back.
	lastDone := make(chan struct{})
	go consume(liveMsgs, lastDone)
	if held != nil {
		held.Nack()
	}

	for deadline := time.Now().Add(receiveTimeout); ; time.Sleep(50 * time.Millisecond) {
		p, err := e.client.XPending(ctx, e.topic, "g").Result()
		require.NoError(t, err)
		mu.Lock()
		got := len(received)
		mu.Unlock()
		if p.Count == 0 && got >= len(sent) {
			break
		}
		if time.Now().After(deadline) {
			c, _ := e.client.XInfoConsumers(ctx, e.topic, "g").Result()
			t.Fatalf("not every message handled and acknowledged: received %d of %d, pending %+v, consumers %+v", got, len(sent), p, c)
		}
	}
	mu.Lock()
	for _, id := range sent {
		assert.True(t, received[id], "message %s lost", id)
	}
	mu.Unlock()

	// At every moment the group holds only live consumers and those not
	// yet past the age; once the age has passed for all, only the live.
	check := func() (departedLeft int) {
		consumers, err := e.client.XInfoConsumers(ctx, e.topic, "g").Result()
		require.NoError(t, err)
		for _, c := range consumers {
			if c.Name == "steady" || c.Name == liveName {
				continue
			}
			departedLeft++
			// A margin of one claim beat and a loaded machine.
			assert.Less(t, c.Idle, age+5*time.Second, "consumer %s is long past the age and still in the group", c.Name)
		}
		return departedLeft
	}
	check()
	require.Eventually(t, func() bool { return check() == 0 }, receiveTimeout, 100*time.Millisecond,
		"departed consumers must be removed")
	consumers, err := e.client.XInfoConsumers(ctx, e.topic, "g").Result()
	require.NoError(t, err)
	var names []string
	for _, c := range consumers {
		names = append(names, c.Name)
	}
	assert.ElementsMatch(t, []string{"steady", liveName}, names)
	require.NoError(t, live.Close())
	require.NoError(t, peer.Close())
	<-peerDone
	<-lastDone
}

// The least-privilege user of the docs (docs/design.md#permissions) runs a
// whole life: Subscribe, Publish (idempotent, with Retention), Nack, an
// undecodable entry dead-lettered, a delayed message, a departed consumer
// removed, Close.
func TestLeastPrivilegeUserRunsEverything(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newEnv(t)
	topic := e.topic
	delayedKey, err := valkeystream.DelayedKey(topic)
	require.NoError(t, err)
	rules := []string{"on", ">secret", "resetkeys", "~" + topic, "~" + topic + ".dead", "~" + topic + ":lease:*", "~" + topic + ":partitions",
		"~" + delayedKey, "resetchannels", "-@all",
		"+xadd", "+xgroup|create", "+xgroup|delconsumer", "+xreadgroup", "+xautoclaim", "+xack", "+xclaim",
		"+xpending", "+xrange", "+xinfo|consumers", "+xinfo|groups", "+exists", "+evalsha", "+eval",
		"+get", "+set", "+pexpire", "+pttl", "+del", "+time", "+zadd", "+zrangebyscore", "+zrem",
		"+client|id", "+client|unblock", "+multi", "+exec",
		// Idempotent publishing and Retention (docs/design.md#permissions).
		"~{" + topic + "}:idmp:*", "+command|docs", "+info"}
	if verbsOf(t, e.client).IdempotentAdd {
		rules = append(rules, "+xgroup|destroy", "+xcfgset") // older servers refuse +xcfgset
	}
	require.NoError(t, e.client.Do(ctx, append([]any{"ACL", "SETUSER", "app"}, toAny(rules)...)...).Err())
	t.Cleanup(func() { _ = e.client.Do(context.Background(), "ACL", "DELUSER", "app").Err() })
	require.NoError(t, e.client.Do(ctx, "ACL", "LOG", "RESET").Err())
	require.NoError(t, e.client.ConfigResetStat(ctx).Err())
	// go-redis sends CLIENT SETINFO and, in its default "auto" mode, CLIENT
	// MAINT_NOTIFICATIONS as it connects, and ignores a refusal, which the
	// server logs: not the library's (see the permissions in docs/design.md).
	app := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), Username: "app", Password: "secret", DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { _ = app.Close() })

	// A consumer that left long ago, for pruning to remove.
	require.NoError(t, e.client.XGroupCreateMkStream(ctx, topic, "g", "0").Err())
	require.NoError(t, e.client.XGroupCreateConsumer(ctx, topic, "g", "departed").Err())

	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: app, ConsumerGroup: "g", Consumer: "app", Start: valkeystream.StartHead,
		BlockTime: 100 * time.Millisecond, ClaimInterval: 100 * time.Millisecond, ClaimMinIdle: 500 * time.Millisecond,
		RemoveIdleConsumersAfter: time.Second, ConsumerLeaseTTL: 500 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: app, IdempotentWindow: time.Minute,
		Retention: map[string]valkeystream.Retention{topic: {MaxLen: 1000}}}, testLogger())
	require.NoError(t, err)

	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, e.client.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{"not", "a message"}}).Err())
	sent := message.NewMessage(watermill.NewUUID(), []byte("x"))
	require.NoError(t, pub.Publish(topic, sent))
	require.NoError(t, pub.Publish(topic, sent), "a copy, stored once")
	m := receive(t, msgs)
	require.Equal(t, sent.UUID, m.UUID)
	m.Ack()
	// A delayed message: stored in the sorted set, moved by the subscription.
	delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(delayed, delay.For(200*time.Millisecond))
	require.NoError(t, pub.Publish(topic, delayed))
	m = receive(t, msgs)
	require.Equal(t, delayed.UUID, m.UUID)
	m.Nack()
	m = receive(t, msgs)
	require.Equal(t, delayed.UUID, m.UUID)
	assert.Equal(t, 2, valkeystream.DeliveryCount(m))
	m.Ack()

	require.Eventually(t, func() bool {
		consumers, err := e.client.XInfoConsumers(ctx, topic, "g").Result()
		return err == nil && len(consumers) == 1 && consumers[0].Name == "app"
	}, receiveTimeout, 50*time.Millisecond, "the departed consumer must be removed")
	// The time is the scenario: a second of lease renewals and claim
	// beats, each of which must be allowed.
	time.Sleep(time.Second)
	require.NoError(t, sub.Close())
	require.NoError(t, pub.Close())

	assert.Zero(t, pub.Stats().FailedCalls, "every Publish must be allowed")
	stats := sub.Stats()
	assert.Equal(t, int64(1), stats.InvalidEntries)
	assert.Zero(t, stats.Faults, "every call must be allowed")
	assert.Equal(t, int64(1), e.client.XLen(ctx, topic+valkeystream.DefaultDeadLetterSuffix).Val())
	assert.Empty(t, e.pending("g"))
	assert.Zero(t, e.client.Exists(ctx, leaseKeyOf(topic, "g", "app")).Val(), "Close released the lease")
	refused, err := e.client.Do(ctx, "ACL", "LOG").Slice()
	require.NoError(t, err)
	assert.Empty(t, refused, "the server refused commands of the documented user (ACL LOG)")
	// Reads were shared: only a shared reader sends CLIENT UNBLOCK (its
	// check when it starts, and its interrupts). Redis 6.2 counts every
	// CLIENT subcommand as one.
	cmdstats, err := e.client.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	assert.True(t, strings.Contains(cmdstats, "cmdstat_client|unblock:calls=") ||
		(!strings.Contains(cmdstats, "cmdstat_client|") && strings.Contains(cmdstats, "cmdstat_client:calls=")),
		"no CLIENT UNBLOCK reached the server: the subscription read on its own")
}

func TestSubscribeFailsWhenTheLeaseIsRefused(t *testing.T) {
	testserver.Parallel(t)
	e := newEnv(t)
	sub := limitedSubscriber(t, e, "no-set", "-set")

	_, err := sub.Subscribe(context.Background(), e.topic)
	require.Error(t, err, "a subscription that cannot lease its name must not start")
	assert.ErrorContains(t, err, "refused the lease")
	assert.ErrorContains(t, err, e.topic+":lease:g:")
	require.NoError(t, sub.Close())
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
