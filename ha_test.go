package valkeystream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/testserver"
)

// haResumeBound is how long after the servers' own promotion of a new
// master the tests allow for Publish errors to stop and consumption to
// resume. The target is 3 s; the bound is generous for a loaded machine and
// still far below the minute a cluster client waits by itself
// (ClusterStateReloadInterval).
const haResumeBound = 15 * time.Second

func clusterClient(t *testing.T, c *testserver.Cluster) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func sentinelClient(t *testing.T, g *testserver.Sentinel) *redis.Client {
	t.Helper()
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    testserver.SentinelMasterName,
		SentinelAddrs: g.SentinelAddrs(),
	})
	t.Cleanup(func() { _ = fc.Close() })
	return fc
}

// haPubSub returns a Publisher and a Subscriber on clients of their own made
// by newClient, closed with them.
func haPubSub(t *testing.T, newClient func() redis.UniversalClient, group string) (message.Publisher, message.Subscriber) {
	t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: newClient(), CloseClient: true}, testLogger())
	require.NoError(t, err)
	// The universal suite Nacks 300 times in a row (TestContinueAfterErrors):
	// a short backoff keeps that from being most of the run; the default
	// timings run in TestPubSub.
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: newClient(), CloseClient: true, ConsumerGroup: group, Start: valkeystream.StartHead,
		NackBackoffMax: 5 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = sub.Close()
		_ = pub.Close()
	})
	return pub, sub
}

// runUniversal runs Watermill's universal suite with consumer groups and
// with fan-out on clients made by newClient.
func runUniversal(t *testing.T, newClient func() redis.UniversalClient) {
	t.Run("groups", func(t *testing.T) {
		universalSuite(t, tests.Features{
			ConsumerGroups:                      true,
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
			ForceShort:                          shortTopologySuites,
		},
			func(t *testing.T) (message.Publisher, message.Subscriber) {
				return haPubSub(t, newClient, "universal-suite")
			},
			func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
				return haPubSub(t, newClient, group)
			},
		)
	})
	t.Run("fan-out", func(t *testing.T) {
		universalSuite(t, tests.Features{
			GuaranteedOrder:                     true,
			GuaranteedOrderWithSingleSubscriber: true,
			Persistent:                          true,
			NewSubscriberReceivesOldMessages:    true,
			ForceShort:                          shortTopologySuites,
		},
			func(t *testing.T) (message.Publisher, message.Subscriber) {
				return haPubSub(t, newClient, "")
			},
			nil,
		)
	})
}

// TestPubSubCluster runs Watermill's universal suite, with consumer groups
// and with fan-out, through ClusterClients (go-redis defaults) on a
// three-master cluster: each topic is one key, so one slot, and the topics
// of a run spread over the masters.
func TestPubSubCluster(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	runUniversal(t, func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	})
}

// TestPubSubSentinel runs Watermill's universal suite, with consumer groups
// and with fan-out, through Sentinel failover clients (go-redis defaults).
func TestPubSubSentinel(t *testing.T) {
	testserver.Parallel(t)
	g := testserver.StartSentinel(t)
	runUniversal(t, func() redis.UniversalClient {
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: testserver.SentinelMasterName, SentinelAddrs: g.SentinelAddrs(),
		})
	})
}

// TestClusterMasterCrash SIGKILLs the master that owns a topic's slot while
// four publishers write and a router consumes, with cluster clients on
// go-redis defaults (a ClusterStateReloadInterval of a minute). Publish
// errors stop and consumption resumes soon after the cluster promoted the
// replica, every message whose Publish returned nil is delivered, and
// nothing stays pending.
func TestClusterMasterCrash(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	const topic = "ha-cluster-crash"
	run := runMasterCrash(t, clusterClient(t, c), clusterClient(t, c), topic, 10*time.Second, func(ctx context.Context) time.Time {
		master, replicas, err := c.SlotOwner(ctx, topic)
		require.NoError(t, err)
		require.Len(t, replicas, 1, "replicas of the slot of %q", topic)
		require.NoError(t, c.Node(master).Kill())
		require.NoError(t, c.WaitMaster(ctx, replicas[0]), "replica %s taking over", replicas[0])
		return time.Now()
	})
	run.log(t)
}

// TestClusterPlannedFailover fails over the master of a topic's slot with
// CLUSTER FAILOVER under the same load: the master stops taking writes
// until its replica has caught up, so no message whose Publish returned nil
// is missing from the new master, and every one is delivered.
func TestClusterPlannedFailover(t *testing.T) {
	testserver.Parallel(t)
	c := testserver.StartCluster(t)
	const topic = "ha-cluster-planned"
	run := runMasterCrash(t, clusterClient(t, c), clusterClient(t, c), topic, 10*time.Second, func(ctx context.Context) time.Time {
		_, replicas, err := c.SlotOwner(ctx, topic)
		require.NoError(t, err)
		require.Len(t, replicas, 1, "replicas of the slot of %q", topic)
		require.NoError(t, c.Failover(ctx, replicas[0]), "planned failover to %s", replicas[0])
		return time.Now()
	})
	require.Empty(t, run.replicationLost, "messages whose Publish returned nil, missing from the new master after a planned failover")
	run.log(t)
}

// TestSentinelMasterCrash SIGKILLs the master of a Sentinel group while
// four publishers write and a router consumes, with failover clients on
// go-redis defaults: the subscription resumes on the promoted replica, and
// the same promises as for a cluster hold.
func TestSentinelMasterCrash(t *testing.T) {
	testserver.Parallel(t)
	g := testserver.StartSentinel(t)
	const topic = "ha-sentinel-crash"
	run := runMasterCrash(t, sentinelClient(t, g), sentinelClient(t, g), topic, 10*time.Second, func(ctx context.Context) time.Time {
		master, err := g.Master(ctx)
		require.NoError(t, err)
		replica := otherNode(g, master)
		require.NoError(t, g.Node(master).Kill())
		require.NoError(t, g.WaitMaster(ctx, replica), "sentinels promoting %s", replica)
		return time.Now()
	})
	run.log(t)
}

// otherNode returns the data node of g that is not addr: the replica of a
// group of two.
func otherNode(g *testserver.Sentinel, addr string) string {
	for _, a := range g.DataAddrs() {
		if a != addr {
			return a
		}
	}
	return ""
}

// sentinelPlannedResume bounds how long after the promotion a planned
// Sentinel failover may stall consumption. The old master stays a master
// for about ten seconds after the promotion, until the sentinels demote
// it: a reader left on it (a client made from a copy of the options, which
// go-redis does not move on +switch-master) reads nothing new until then.
// The target is the promotion plus one second; the bound leaves room for a
// loaded machine and still fails a reader that waits for the demotion.
const sentinelPlannedResume = 5 * time.Second

// The old master takes writes until the sentinels demote it, and loses
// them then: an XACK sent to it after the promotion is gone, and its entry
// stays pending on the new master until the subscription's claim takes it
// back after ClaimMinIdle (docs/high-availability.md): on the first claim
// beat after ClaimMinIdle, then it is delivered and acknowledged again. The
// rest is room for a loaded machine.
const plannedSettle = valkeystream.DefaultClaimMinIdle + valkeystream.DefaultClaimInterval + 25*time.Second

// TestSentinelPlannedFailover asks the sentinels for a failover
// (SENTINEL FAILOVER) while four publishers write and a router consumes,
// with failover clients on go-redis defaults: consumption follows the new
// master soon after the promotion, every message whose Publish returned nil
// is delivered, and nothing stays pending.
func TestSentinelPlannedFailover(t *testing.T) {
	testserver.Parallel(t)
	g := testserver.StartSentinel(t)
	const topic = "ha-sentinel-planned"
	run := runMasterCrash(t, sentinelClient(t, g), sentinelClient(t, g), topic, plannedSettle, func(ctx context.Context) time.Time {
		old, err := g.Failover(ctx)
		require.NoError(t, err)
		replica := otherNode(g, old)
		require.NoError(t, g.WaitMaster(ctx, replica), "sentinels promoting %s", replica)
		return time.Now()
	})
	if got := run.newMaster; got > sentinelPlannedResume && assertTimings {
		t.Errorf("consumption resumed %s after the promotion, want at most %s: a blocking reader stayed on the old master", got, sentinelPlannedResume)
	}
	run.log(t)
}

// crashRun is what a master crash cost, measured from the kill.
type crashRun struct {
	promoted   time.Duration // until the servers named the new master
	lastPubErr time.Duration // until the last failed Publish returned (0: none failed)
	resumed    time.Duration // until the first delivery of a message whose Publish began after the kill
	newMaster  time.Duration // from the promotion until the first delivery of a message whose Publish began after it
	slowest    time.Duration // the longest Publish call
	// replicationLost lists the messages whose Publish returned nil but
	// that the new master's stream lacks.
	replicationLost []string
	published       int // Publish calls that returned nil
	failed          int // Publish calls that returned an error
	duplicates      int // deliveries of a message already delivered
	publishErrors   []string
}

func (r crashRun) log(t *testing.T) {
	t.Logf("promotion %s after the failover began; %d publishes failed, the last %s after the failover began (%s after the promotion); "+
		"consumption resumed %s after the failover began (%s after the promotion; the first message published after the promotion %s after it); %d published, %d of them lost by asynchronous replication, the slowest call took %s; %d duplicate deliveries; first errors: %v",
		r.promoted.Round(time.Millisecond), r.failed, r.lastPubErr.Round(time.Millisecond), (r.lastPubErr - r.promoted).Round(time.Millisecond),
		r.resumed.Round(time.Millisecond), (r.resumed - r.promoted).Round(time.Millisecond), r.newMaster.Round(time.Millisecond), r.published, len(r.replicationLost), r.slowest.Round(time.Millisecond), r.duplicates, r.publishErrors)
}

// runMasterCrash publishes to topic from four goroutines, one message per
// call, and consumes it through a router (group "ha"), calls crash once
// messages flow, and returns once every message whose Publish returned nil
// was delivered and, within settle, nothing is pending. crash kills the
// master and returns when the servers have promoted its replica.
func runMasterCrash(t *testing.T, pubClient, subClient redis.UniversalClient, topic string, settle time.Duration, crash func(context.Context) time.Time) crashRun {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+settle)
	defer cancel()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: pubClient}, testLogger())
	require.NoError(t, err)
	defer pub.Close()
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: subClient, ConsumerGroup: "ha", Consumer: "c1", Start: valkeystream.StartHead,
	}, testLogger())
	require.NoError(t, err)
	defer sub.Close()

	var (
		mu          sync.Mutex
		killed      time.Time
		published   = map[string]time.Time{} // uuid -> when its Publish, which returned nil, began
		delivered   = map[string]time.Time{} // uuid -> first delivery
		run         crashRun
		lastFailure time.Time
		progress    = make(chan struct{}, 1)
	)
	notify := func() {
		select {
		case progress <- struct{}{}:
		default:
		}
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, testLogger())
	require.NoError(t, err)
	router.AddNoPublisherHandler("ha", topic, sub, func(msg *message.Message) error {
		mu.Lock()
		if _, ok := delivered[msg.UUID]; ok {
			run.duplicates++
		} else {
			delivered[msg.UUID] = time.Now()
		}
		mu.Unlock()
		notify()
		return nil
	})
	routerDone := make(chan struct{})
	go func() {
		defer close(routerDone)
		_ = router.Run(ctx)
	}()
	defer func() {
		_ = router.Close()
		<-routerDone
	}()
	<-router.Running()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				msg := message.NewMessage(watermill.NewUUID(), []byte("ha"))
				began := time.Now()
				err := pub.Publish(topic, msg)
				took := time.Since(began)
				mu.Lock()
				run.slowest = max(run.slowest, took)
				if err == nil {
					published[msg.UUID] = began
				} else {
					run.failed++
					lastFailure = time.Now()
					if len(run.publishErrors) < 3 {
						run.publishErrors = append(run.publishErrors, err.Error())
					}
				}
				mu.Unlock()
				notify()
			}
		}()
	}
	stopPublishers := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopPublishers()

	// waitFor waits until cond holds (checked under mu).
	waitFor := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.After(limit)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-progress:
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: not within %s (%d published, %d delivered, %d failed publishes; first errors %v)",
					what, limit, len(published), len(delivered), run.failed, run.publishErrors)
			}
		}
	}

	waitFor("messages flowing before the crash", 30*time.Second, func() bool { return len(delivered) >= 100 })
	mu.Lock()
	killed = time.Now()
	mu.Unlock()
	promotedAt := crash(ctx)

	// After the kill: publishes succeed again, and those are consumed.
	waitFor("publishing and consuming after the promotion", haResumeBound+10*time.Second, func() bool {
		n := 0
		for id, at := range published {
			if at.After(promotedAt) {
				if _, ok := delivered[id]; ok {
					n++
				}
			}
		}
		return n >= 50
	})
	stopPublishers()

	// A message the old master acknowledged but had not sent to its replica
	// when it died is gone from the stream: asynchronous replication loses
	// it, and no client can deliver it (WaitReplicas prevents that, see
	// wait_test.go). Every message that is in the stream must be delivered.
	inStream := map[string]bool{}
	entries, err := subClient.XRange(ctx, topic, "-", "+").Result()
	require.NoError(t, err, "XRANGE %s on the new master", topic)
	for _, e := range entries {
		if id, ok := e.Values[valkeystream.FieldUUID].(string); ok {
			inStream[id] = true
		}
	}
	waitFor("every published message in the stream delivered", 30*time.Second, func() bool {
		for id := range published {
			if _, ok := delivered[id]; !ok && inStream[id] {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for id := range published {
		if !inStream[id] {
			run.replicationLost = append(run.replicationLost, id)
		}
	}
	mu.Unlock()
	// While the subscription still runs: what it left pending is
	// delivered again and acknowledged, within settle.
	requireNothingPendingWithin(t, subClient, topic, "ha", settle)

	mu.Lock()
	defer mu.Unlock()
	run.promoted = promotedAt.Sub(killed)
	run.published = len(published)
	if lastFailure.After(killed) {
		run.lastPubErr = lastFailure.Sub(killed)
	}
	// firstDelivery is the first delivery of a message whose Publish began
	// after since.
	firstDelivery := func(since time.Time) time.Time {
		var first time.Time
		for id, at := range published {
			d, ok := delivered[id]
			if ok && at.After(since) && (first.IsZero() || d.Before(first)) {
				first = d
			}
		}
		return first
	}
	run.resumed = firstDelivery(killed).Sub(killed)
	run.newMaster = firstDelivery(promotedAt).Sub(promotedAt)
	if got := run.lastPubErr - run.promoted; got > haResumeBound && assertTimings {
		t.Errorf("Publish kept failing %s after the promotion, want at most %s", got, haResumeBound)
	}
	if got := run.resumed - run.promoted; got > haResumeBound && assertTimings {
		t.Errorf("consumption resumed %s after the promotion, want at most %s", got, haResumeBound)
	}
	return run
}

// requireNothingPendingWithin waits up to within until the group holds no
// pending entry, and logs how long it took when it took more than a second.
func requireNothingPendingWithin(t *testing.T, client redis.UniversalClient, key, group string, within time.Duration) {
	t.Helper()
	began := time.Now()
	deadline := began.Add(within)
	var first *redis.XPending
	for {
		p, err := client.XPending(context.Background(), key, group).Result()
		if err == nil && p.Count == 0 {
			if waited := time.Since(began); waited > time.Second {
				t.Logf("%d entries were still pending when every message had been delivered; the last left %s later", first.Count, waited.Round(time.Millisecond))
			}
			return
		}
		if err == nil && first == nil {
			first = p
		}
		if time.Now().After(deadline) {
			t.Fatalf("XPENDING %s %s = %+v, %v; want 0 pending", key, group, p, err)
		}
		time.Sleep(50 * time.Millisecond) // the poll of a wait for nothing pending
	}
}
