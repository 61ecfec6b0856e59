package valkeystream_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/echomq/valkeystream/internal/partition"
	"github.com/echomq/valkeystream/internal/serverinfo"
	"github.com/echomq/valkeystream/internal/testserver"
)

// The ACL of each use is documented in docs/design.md ("Keys, cluster slots
// and permissions"), one fenced block under a heading of its own. The tests
// here read those blocks, create the user of each on the test server, run
// the use as that user, and check three things:
//
//   - the server refused nothing: ACL LOG is empty;
//   - the use took the path it takes for an unrestricted user: the verbs
//     the server has were found, reads were shared;
//   - every command the block grants was sent (INFO commandstats), but
//     those the test names as out of its run's reach, with the reason. A
//     block that grants what the library never sends fails here, as one
//     that lacks a permission fails the ACL LOG check.
//
// A test whose user combines several blocks (a Subscriber and a Publisher)
// checks the commands of all of them, or of the one it is about; a command
// that two blocks grant counts as sent for both.

// aclDocs is the page that holds the blocks.
const aclDocs = "docs/design.md"

// aclReset is the first line of every block: it resets the user.
const aclReset = "on >secret resetkeys resetchannels -@all"

// aclLine is one ACL SETUSER line of a block: its rules (after the user's
// name), and the condition its comment names, "" for none.
type aclLine struct {
	rules []string
	when  string
}

// aclBlock returns the lines of the block under the heading "#### "+title
// in the permissions section of docs/design.md: a block of its own, whose
// first line resets the user.
func aclBlock(t testing.TB, title string) []aclLine {
	t.Helper()
	lines := aclLines(t, title)
	require.Equal(t, aclReset, strings.Join(lines[0].rules, " "), "%s, %q: the first line must reset the user", aclDocs, title)
	return lines
}

// aclExtra is aclBlock for a block that adds to others: it resets nothing.
func aclExtra(t testing.TB, title string) []aclLine {
	t.Helper()
	lines := aclLines(t, title)
	for _, l := range lines {
		require.NotEqual(t, aclReset, strings.Join(l.rules, " "), "%s, %q: a block that adds to others must not reset the user", aclDocs, title)
	}
	return lines
}

// aclLines returns the lines of the fenced block under the heading
// "#### "+title in the permissions section of docs/design.md.
func aclLines(t testing.TB, title string) []aclLine {
	t.Helper()
	data, err := os.ReadFile(aclDocs)
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(data), "\n### Keys, cluster slots and permissions\n")
	require.True(t, ok, "%s has no section \"Keys, cluster slots and permissions\"", aclDocs)
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	_, rest, ok := strings.Cut(section, "\n#### "+title+"\n")
	require.True(t, ok, "%s: no heading %q in its permissions section", aclDocs, "#### "+title)
	if end := strings.Index(rest, "\n#### "); end >= 0 {
		rest = rest[:end]
	}
	_, rest, ok = strings.Cut(rest, "\n```\n")
	require.True(t, ok, "%s, %q: no fenced block", aclDocs, title)
	body, _, ok := strings.Cut(rest, "\n```\n")
	require.True(t, ok, "%s, %q: the fenced block does not end", aclDocs, title)
	var lines []aclLine
	for _, text := range strings.Split(body, "\n") {
		rules, when, _ := strings.Cut(text, " # ")
		fields := strings.Fields(rules)
		require.True(t, len(fields) > 3 && fields[0] == "ACL" && fields[1] == "SETUSER",
			"%s, %q: %q is not an ACL SETUSER line with rules", aclDocs, title, text)
		lines = append(lines, aclLine{rules: fields[3:], when: strings.TrimSpace(when)})
	}
	return lines
}

// aclServer is what the test server has, as an unrestricted user finds
// out.
type aclServer struct {
	name         string // "redis" or "valkey"
	major, minor int    // of its own version
	// verbs and refused are what the library's probe finds out for an
	// unrestricted user: the path a restricted one must take too.
	verbs   serverinfo.Verbs
	refused string
}

// aclRun is one test's server, its user, and what the user was granted.
type aclRun struct {
	t    *testing.T
	e    *env // the server, and a client of an unrestricted user
	srv  aclServer
	user string
	// uses says, for each use a line's condition may name ("delayed
	// messages"), whether this run has it; a condition it does not
	// declare fails the test.
	uses map[string]bool
	// checked are the commands whose sending the run checks.
	checked map[string]bool
	// adminInfos counts the unrestricted client's INFO calls since start.
	adminInfos int64
}

func newACLRun(t *testing.T) *aclRun {
	t.Helper()
	e := newEnv(t)
	version := e.srv.Version()
	parts := strings.SplitN(version, ".", 3)
	require.GreaterOrEqual(t, len(parts), 2, "server version %q", version)
	major, err := strconv.Atoi(parts[0])
	require.NoError(t, err)
	minor, err := strconv.Atoi(parts[1])
	require.NoError(t, err)
	v, refused, err := serverinfo.Probe(context.Background(), e.client)
	require.NoError(t, err)
	return &aclRun{t: t, e: e, user: "acl-" + watermill.NewShortUUID(), checked: map[string]bool{},
		srv: aclServer{name: e.srv.Name(), major: major, minor: minor, verbs: v, refused: refused}}
}

// holds reports whether a line whose comment names when applies to this
// run: each of its comma-separated parts names a server the test knows, or
// a use the run declares.
func (r *aclRun) holds(when string) bool {
	if when == "" {
		return true
	}
	for _, part := range strings.Split(when, ", ") {
		if !r.holdsPart(part) {
			return false
		}
	}
	return true
}

func (r *aclRun) holdsPart(part string) bool {
	s := r.srv
	switch part {
	case "on Redis 8.2 and 8.4":
		return s.name == "redis" && s.major == 8 && (s.minor == 2 || s.minor == 4)
	case "on Redis 8.6 and later":
		return s.verbs.IdempotentAdd
	case "before Redis 8.6 and on Valkey":
		return !s.verbs.IdempotentAdd
	case "on Redis 6.2":
		return s.major < 7
	case "not on Redis 6.2":
		return s.major >= 7
	}
	use, ok := r.uses[part]
	if !ok {
		r.t.Fatalf("%s: a line's condition %q names neither a server this test knows nor a use the test declares (%v)",
			aclDocs, part, r.uses)
	}
	return use
}

// aclGrant is a block to grant, with topics in place of the docs' names.
type aclGrant struct {
	lines []aclLine
	names *strings.Replacer // e.g. "orders" with the test's topic
	// checked makes the run check that each command this block grants is
	// sent.
	checked bool
}

// grant creates the run's user with the lines of blocks whose conditions
// hold: the reset line once, then the other lines in order.
func (r *aclRun) grant(blocks ...aclGrant) {
	r.t.Helper()
	ctx := context.Background()
	for i, b := range blocks {
		for j, l := range b.lines {
			if j == 0 && i > 0 && strings.Join(l.rules, " ") == aclReset {
				continue
			}
			if !r.holds(l.when) {
				continue
			}
			args := []any{"ACL", "SETUSER", r.user}
			for _, rule := range l.rules {
				rule = b.names.Replace(rule)
				args = append(args, rule)
				if cmd, ok := strings.CutPrefix(rule, "+"); ok {
					require.False(r.t, strings.HasPrefix(cmd, "@"), "%s: %q grants a category: name the commands", aclDocs, rule)
					if b.checked {
						r.checked[cmd] = true
					}
				}
			}
			require.NoError(r.t, r.e.client.Do(ctx, args...).Err(), "ACL SETUSER %v", args[3:])
		}
	}
	r.t.Cleanup(func() { _ = r.e.client.Do(context.Background(), "ACL", "DELUSER", r.user).Err() })
}

// start forgets what happened before the run: the scripts the server has
// cached (so that the run loads its own), the ACL LOG and the command
// counts. From here on, the unrestricted client sends nothing the blocks
// grant, but INFO (counted, see calls) and CONFIG SET.
func (r *aclRun) start() {
	r.t.Helper()
	ctx := context.Background()
	require.NoError(r.t, r.e.client.ScriptFlush(ctx).Err())
	require.NoError(r.t, r.e.client.Do(ctx, "ACL", "LOG", "RESET").Err())
	require.NoError(r.t, r.e.client.ConfigResetStat(ctx).Err())
}

// client returns a client logged in as the run's user. It sends neither
// CLIENT SETINFO nor CLIENT MAINT_NOTIFICATIONS, which go-redis sends on
// connecting and the library needs not (docs/design.md).
func (r *aclRun) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.e.srv.Addr(), Username: r.user, Password: "secret", PoolSize: 32,
		DisableIdentity: true, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// statName is the name INFO commandstats counts cmd under: Redis 6.2
// counts a command's subcommands together.
func (r *aclRun) statName(cmd string) string {
	if r.srv.major < 7 {
		cmd, _, _ = strings.Cut(cmd, "|")
	}
	return cmd
}

// calls returns how many times the server ran each command since start,
// the unrestricted client's INFO calls left out.
func (r *aclRun) calls() map[string]int64 {
	r.t.Helper()
	info, err := r.e.client.Info(context.Background(), "commandstats").Result()
	require.NoError(r.t, err)
	counts := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
		require.NoError(r.t, err)
		counts[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	counts["info"] -= r.adminInfos // those before this one's reply
	r.adminInfos++
	return counts
}

// waitSent waits until the server has run each of cmds: what the
// subscriptions' beats send.
func (r *aclRun) waitSent(cmds ...string) {
	r.t.Helper()
	waitUntil(r.t, fmt.Sprintf("the server ran %v", cmds), func() bool {
		calls := r.calls()
		for _, c := range cmds {
			if calls[r.statName(c)] == 0 {
				return false
			}
		}
		return true
	})
}

// check fails the test for every refusal in ACL LOG, and for every command
// the checked blocks grant that was never sent, but those of notReached
// (command: why this run does not reach it).
func (r *aclRun) check(notReached map[string]string) {
	r.t.Helper()
	log, err := r.e.client.Do(context.Background(), "ACL", "LOG").Slice()
	require.NoError(r.t, err)
	assert.Empty(r.t, refusals(log), "the server refused commands of the documented user (ACL LOG)")
	calls := r.calls()
	var unsent []string
	for cmd := range r.checked {
		if _, ok := notReached[cmd]; !ok && calls[r.statName(cmd)] == 0 {
			unsent = append(unsent, cmd)
		}
	}
	slices.Sort(unsent)
	assert.Empty(r.t, unsent, "%s grants commands this use never sent", aclDocs)
	for cmd, why := range notReached {
		assert.True(r.t, r.checked[cmd], "the test names +%s as out of its reach (%s), and the blocks it checks do not grant it", cmd, why)
	}
}

// noteFaults logs the faults a part of the run counted. A call the server
// refused the user is in the ACL LOG, which check requires empty; a fault
// otherwise is a call that failed for another reason (a timeout on a
// loaded machine), which says nothing of the ACL.
func (r *aclRun) noteFaults(who string, faults int64) {
	if faults > 0 {
		r.t.Logf("%s: %d failed calls (refusals would be in the ACL LOG, checked)", who, faults)
	}
}

// refusals describes the entries of an ACL LOG reply: what was refused
// (a command, a key), where (a script, a transaction), how often.
func refusals(log []any) []string {
	var out []string
	for _, entry := range log {
		fields := map[string]any{}
		switch en := entry.(type) {
		case map[any]any: // RESP3
			for k, v := range en {
				fields[fmt.Sprint(k)] = v
			}
		case []any: // RESP2
			for i := 0; i+1 < len(en); i += 2 {
				fields[fmt.Sprint(en[i])] = en[i+1]
			}
		}
		out = append(out, fmt.Sprintf("%v %q refused (%v, %v times)", fields["reason"], fields["object"], fields["context"], fields["count"]))
	}
	return out
}

// notOnAFullServer is why a run does not send XINFO GROUPS.
const notOnAFullServer = "sent on a full server only: TestACLSubscriberOnAFullServer"

// checkVerbs fails the test unless a side whose Info lines are log and
// whose Stats name verbs found out what an unrestricted user finds out:
// the same verbs, and a refusal only where the server refuses anyone (Redis
// 6.2 has no COMMAND DOCS).
func (r *aclRun) checkVerbs(log *errorLog, verbs string) {
	r.t.Helper()
	assert.Equal(r.t, r.srv.verbs.String(), verbs, "the verbs found out")
	told := 0
	for _, line := range log.infoLines() {
		if !strings.Contains(line, "stream verbs") {
			continue
		}
		told++
		assert.Equal(r.t, r.srv.refused != "", strings.Contains(line, "refused"),
			"the probe's refusal (an unrestricted user's: %q): %s", r.srv.refused, line)
	}
	assert.Positive(r.t, told, "no Info line names the verbs")
}

// checkSharedReads fails the test unless the subscriptions shared their
// reads: no Info line says they may not, and the server ran CLIENT UNBLOCK
// (a shared reader's check when it starts, and its interrupts).
func (r *aclRun) checkSharedReads(log *errorLog) {
	r.t.Helper()
	for _, line := range log.infoLines() {
		assert.NotContains(r.t, line, "shared reads need", "reads were not shared")
	}
	assert.Positive(r.t, r.calls()[r.statName("client|unblock")], "no CLIENT UNBLOCK reached the server: reads were not shared")
}

// aclTopic is a topic name of the test's own: "orders" of the docs becomes
// it.
func aclTopic() string { return "t" + strings.ToLower(watermill.NewShortUUID()) }

// addEntry appends msg to stream as DefaultMarshaler writes it, through
// client.
func addEntry(t *testing.T, client redis.Cmdable, stream string, msg *message.Message) {
	t.Helper()
	values, err := valkeystream.DefaultMarshaler{}.Marshal(stream, msg)
	require.NoError(t, err)
	require.NoError(t, client.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: values}).Err())
}

// makeDue makes the delayed messages of stream due, through client:
// published with a long delay, so that they wait however slow the machine,
// they are moved at a Subscriber's next poll.
func makeDue(t *testing.T, client *redis.Client, stream string) {
	t.Helper()
	ctx := context.Background()
	key, err := valkeystream.DelayedKey(stream)
	require.NoError(t, err)
	members, err := client.ZRange(ctx, key, 0, -1).Result()
	require.NoError(t, err)
	for _, m := range members {
		require.NoError(t, client.ZAddXX(ctx, key, redis.Z{Score: 0, Member: m}).Err())
	}
}

// aclSubscriberConfig is a group Subscriber whose beats come quickly, so
// that a run reaches the lease renewals, hold beats, claim beats and the
// removal of departed consumers within seconds.
func aclSubscriberConfig(client redis.UniversalClient, deleteAcked bool) valkeystream.SubscriberConfig {
	return valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "g", Consumer: "app", Start: valkeystream.StartHead,
		BlockTime: 100 * time.Millisecond, ClaimInterval: 100 * time.Millisecond, ClaimMinIdle: 600 * time.Millisecond,
		AckFlushInterval: 10 * time.Millisecond, NackResendDelay: 10 * time.Millisecond,
		// Renewed every 600 ms: a renewal is seen soon, and a loaded machine
		// does not let the first Subscriber's lease lapse before the second
		// finds the name held.
		RemoveIdleConsumersAfter: time.Second, ConsumerLeaseTTL: 3 * time.Second,
		DelayedPollInterval: 20 * time.Millisecond, DelayedIdlePollInterval: 20 * time.Millisecond,
		DeleteAcked: deleteAcked,
	}
}

// merge sends what each channel delivers until every channel is closed.
func merge(chans ...<-chan *message.Message) <-chan *message.Message {
	out := make(chan *message.Message)
	var wg sync.WaitGroup
	for _, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range ch {
				out <- m
			}
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}

// subscriberLife runs the life of a consumer-group subscription of topic as
// the run's user: two Subscribers of one Consumer name (so that the second
// finds the name held), a name whose holder died with an entry pending
// (taken over), an undecodable entry (dead-lettered), a message held
// across hold beats, a delayed message (moved, Nacked, delivered again), a
// departed consumer (removed), lease renewals and claim beats, Close. With
// withPublisher, a Publisher of the user publishes the messages, and the
// DeadLetter middleware gives one up through it; otherwise an unrestricted
// client adds them before the run. Then it checks the run (aclRun.check, with
// notReached), and what the server holds.
func subscriberLife(t *testing.T, r *aclRun, topic string, app *redis.Client, withPublisher bool, notReached map[string]string) {
	ctx := context.Background()
	admin := r.e.client
	// What the server holds when the run starts.
	require.NoError(t, admin.XGroupCreateMkStream(ctx, topic, "g", "0").Err())
	require.NoError(t, admin.XGroupCreateConsumer(ctx, topic, "g", "departed").Err())
	orphan := message.NewMessage(watermill.NewUUID(), []byte("left by a dead holder"))
	addEntry(t, admin, topic, orphan)
	require.NoError(t, admin.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "app-2", Streams: []string{topic, ">"}, Count: 1, Block: -1}).Err())
	require.NoError(t, admin.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{"not", "a message"}}).Err())
	plain := []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("1")), message.NewMessage(watermill.NewUUID(), []byte("2"))}
	later := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(later, delay.For(time.Hour))
	givenUp := message.NewMessage(watermill.NewUUID(), []byte("given up"))
	var pub *valkeystream.Publisher
	if withPublisher {
		var err error
		pub, err = valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: app}, testLogger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
	} else {
		for _, m := range plain {
			addEntry(t, admin, topic, m)
		}
		before := r.e.publisher()
		require.NoError(t, before.Publish(topic, later))
		makeDue(t, admin, topic)
	}
	r.start()

	log := newErrorLog(testLogger())
	cfg := aclSubscriberConfig(app, r.uses["DeleteAcked"])
	var subs []*valkeystream.Subscriber
	var chans []<-chan *message.Message
	for range 2 {
		sub, err := valkeystream.NewSubscriber(cfg, log)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		subs = append(subs, sub)
		chans = append(chans, msgs)
	}
	want := append([]*message.Message{orphan, later}, plain...)
	if withPublisher {
		require.NoError(t, pub.Publish(topic, plain...))
		require.NoError(t, pub.Publish(topic, later))
		makeDue(t, admin, topic) // after the Publisher's ZADD
		require.NoError(t, pub.Publish(topic, givenUp))
		want = append(want, givenUp)
	}
	giveUp := func(msg *message.Message) {
		deadLetter, err := valkeystream.DeadLetter(valkeystream.DeadLetterConfig{Publisher: pub, MaxDeliveries: 1,
			Topic: topic + valkeystream.DefaultDeadLetterSuffix}, testLogger())
		require.NoError(t, err)
		_, err = deadLetter(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("declined") })(msg)
		require.NoError(t, err, "the dead letter of %s", msg.UUID)
	}

	deliveries := merge(chans...)
	acked := map[string]bool{}
	nacked := false
	held := false
	for len(acked) < len(want) {
		m := receive(t, deliveries)
		if m.UUID == later.UUID && !nacked {
			nacked = true
			m.Nack()
			continue
		}
		if !held {
			// Held across hold beats (XPENDING, XRANGE, XCLAIM in a
			// script) and lease renewals.
			held = true
			r.waitSent("xrange", "pexpire")
		}
		if m.UUID == givenUp.UUID {
			giveUp(m)
		}
		assert.False(t, acked[m.UUID], "message %s delivered again after its Ack", m.UUID)
		acked[m.UUID] = true
		m.Ack()
	}
	for _, m := range want {
		assert.True(t, acked[m.UUID], "message %s not delivered", m.UUID)
	}
	// Claim beats, and the removal of the departed consumer.
	r.waitSent("xautoclaim", "xinfo|consumers", "xgroup|delconsumer")
	invalid := func() (n int64) {
		for _, s := range subs {
			n += s.Stats().InvalidEntries
		}
		return n
	}
	waitUntil(t, "the undecodable entry dead-lettered", func() bool { return invalid() == 1 })
	for _, s := range subs {
		require.NoError(t, s.Close())
	}

	for i, s := range subs {
		stats := s.Stats()
		r.noteFaults(fmt.Sprintf("Subscriber %d", i), stats.Faults)
		assert.Equal(t, r.srv.verbs.String(), stats.Verbs, "Subscriber %d: the verbs found out", i)
	}
	r.checkVerbs(log, subs[0].Stats().Verbs)
	r.checkSharedReads(log)
	dead := int64(1)
	if withPublisher {
		dead++
		assert.Zero(t, pub.Stats().FailedCalls, "every Publish must be allowed")
	}
	r.check(notReached)
	assert.Equal(t, dead, admin.XLen(ctx, topic+valkeystream.DefaultDeadLetterSuffix).Val(), "dead letters")
	assert.Empty(t, r.e.pendingIn(topic, "g"), "entries left pending")
}

// pendingIn lists the pending entries of group in stream.
func (e *env) pendingIn(stream, group string) []redis.XPendingExt {
	e.t.Helper()
	p, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: stream, Group: group, Start: "-", End: "+", Count: 1000}).Result()
	require.NoError(e.t, err)
	return p
}

// TestACLSubscriber runs a consumer-group Subscriber's life as the user of
// the docs' block.
func TestACLSubscriber(t *testing.T) {
	testserver.Parallel(t)
	r := newACLRun(t)
	r.uses = map[string]bool{"DeleteAcked": r.srv.verbs.AckDel}
	topic := aclTopic()
	r.grant(aclGrant{lines: aclBlock(t, "A consumer-group Subscriber"), names: strings.NewReplacer("orders", topic), checked: true})
	subscriberLife(t, r, topic, r.client(), false, map[string]string{"xinfo|groups": notOnAFullServer})
}

// TestACLSubscriberAndPublisher runs the same life with the messages
// published by a Publisher of the same user, which the DeadLetter
// middleware uses too: the two blocks on one user, as the docs combine
// them.
func TestACLSubscriberAndPublisher(t *testing.T) {
	testserver.Parallel(t)
	r := newACLRun(t)
	r.uses = map[string]bool{"DeleteAcked": r.srv.verbs.AckDel, "delayed messages": true, "WaitReplicas": false,
		"the DeadLetter middleware's Publisher": true}
	topic := aclTopic()
	names := strings.NewReplacer("orders", topic)
	r.grant(aclGrant{lines: aclBlock(t, "A consumer-group Subscriber"), names: names, checked: true},
		aclGrant{lines: aclBlock(t, "A Publisher"), names: names, checked: true})
	subscriberLife(t, r, topic, r.client(), true, map[string]string{"xinfo|groups": notOnAFullServer})
}

// TestACLSubscriberOnAFullServer subscribes as the Subscriber's user on a
// full server (maxmemory, noeviction), where XGROUP CREATE is refused with
// OOM and XINFO GROUPS confirms that the group exists.
func TestACLSubscriberOnAFullServer(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	r := newACLRun(t)
	r.uses = map[string]bool{"DeleteAcked": false}
	topic := aclTopic()
	r.grant(aclGrant{lines: aclBlock(t, "A consumer-group Subscriber"), names: strings.NewReplacer("orders", topic)})
	admin := r.e.client
	require.NoError(t, admin.XGroupCreateMkStream(ctx, topic, "g", "0").Err())
	sent := message.NewMessage(watermill.NewUUID(), []byte("backlog"))
	addEntry(t, admin, topic, sent)
	r.start()
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	require.ErrorContains(t, admin.LPush(ctx, "probe", "x").Err(), "OOM", "the server is not full: the test shows nothing")

	sub, err := valkeystream.NewSubscriber(aclSubscriberConfig(r.client(), false), testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	m := receive(t, msgs)
	assert.Equal(t, sent.UUID, m.UUID)
	m.Ack()
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
	require.NoError(t, sub.Close())
	assert.Positive(t, r.calls()[r.statName("xinfo|groups")], "Subscribe did not ask for the group")
	r.check(nil)
}

// TestACLFanOutSubscriber runs a fan-out subscription as the user of the
// docs' block: it starts at the last entry and gets a delayed message the
// Subscriber moves.
func TestACLFanOutSubscriber(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	r := newACLRun(t)
	topic := aclTopic()
	r.grant(aclGrant{lines: aclBlock(t, "A fan-out Subscriber"), names: strings.NewReplacer("orders", topic), checked: true})
	later := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(later, delay.For(time.Hour))
	require.NoError(t, r.e.publisher().Publish(topic, later))
	makeDue(t, r.e.client, topic)
	r.start()

	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{Client: r.client(), Start: valkeystream.StartNew,
		BlockTime: 100 * time.Millisecond, DelayedPollInterval: 20 * time.Millisecond, DelayedIdlePollInterval: 20 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	m := receive(t, msgs)
	assert.Equal(t, later.UUID, m.UUID)
	m.Ack()
	require.NoError(t, sub.Close())
	r.noteFaults("Subscriber", sub.Stats().Faults)
	r.check(nil)
}

// TestACLPublisher publishes plain and delayed messages, and with
// WaitReplicas, as the user of the docs' Publisher block.
func TestACLPublisher(t *testing.T) {
	testserver.Parallel(t)
	r := newACLRun(t)
	r.uses = map[string]bool{"delayed messages": true, "WaitReplicas": true, "the DeadLetter middleware's Publisher": false}
	topic := aclTopic()
	r.grant(aclGrant{lines: aclBlock(t, "A Publisher"), names: strings.NewReplacer("orders", topic), checked: true})
	r.start()
	app := r.client()

	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: app}, testLogger())
	require.NoError(t, err)
	later := message.NewMessage(watermill.NewUUID(), []byte("later"))
	delay.Message(later, delay.For(time.Hour))
	require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("now"))))
	require.NoError(t, pub.Publish(topic, later))
	require.NoError(t, pub.Close())
	// The test server has no replicas: WAIT counts none, and the Publish
	// says so.
	waiting, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: app, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond}, testLogger())
	require.NoError(t, err)
	err = waiting.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte("replicated")))
	require.ErrorIs(t, err, valkeystream.ErrNotReplicated)
	require.NoError(t, waiting.Close())

	assert.Zero(t, pub.Stats().FailedCalls, "every Publish must be allowed")
	r.check(nil)
	ctx := context.Background()
	assert.Equal(t, int64(2), r.e.client.XLen(ctx, topic).Val(), "entries written")
	delayedKey, err := valkeystream.DelayedKey(topic)
	require.NoError(t, err)
	assert.Equal(t, int64(1), r.e.client.ZCard(ctx, delayedKey).Val(), "delayed messages waiting")
}

// TestACLIdempotentPublisherAndRetention publishes with a Retention that
// keeps unacknowledged entries, and with IdempotentWindow, as the user of
// the docs' Publisher block and the lines that add to it.
func TestACLIdempotentPublisherAndRetention(t *testing.T) {
	for _, idempotent := range []bool{false, true} {
		name := "Retention"
		if idempotent {
			name = "IdempotentWindow"
		}
		t.Run(name, func(t *testing.T) {
			testserver.Parallel(t)
			r := newACLRun(t)
			r.uses = map[string]bool{"delayed messages": false, "WaitReplicas": false, "the DeadLetter middleware's Publisher": false,
				"IdempotentWindow": idempotent}
			topic := aclTopic()
			names := strings.NewReplacer("orders", topic)
			r.grant(aclGrant{lines: aclBlock(t, "A Publisher"), names: names, checked: true},
				aclGrant{lines: aclExtra(t, "Idempotent publishing and `Retention`"), names: names, checked: true})
			r.start()

			log := newErrorLog(testLogger())
			cfg := valkeystream.PublisherConfig{Client: r.client(), Retention: map[string]valkeystream.Retention{topic: {MaxLen: 1000}}}
			if idempotent {
				cfg = valkeystream.PublisherConfig{Client: cfg.Client, IdempotentWindow: time.Minute}
			}
			pub, err := valkeystream.NewPublisher(cfg, log)
			require.NoError(t, err)
			msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
			require.NoError(t, pub.Publish(topic, msg))
			require.NoError(t, pub.Publish(topic, msg))
			require.NoError(t, pub.Close())

			stats := pub.Stats()
			assert.Zero(t, stats.FailedCalls, "every Publish must be allowed")
			r.checkVerbs(log, stats.Verbs)
			stored := int64(2)
			if idempotent {
				stored = 1
			}
			assert.Equal(t, stored, r.e.client.XLen(context.Background(), topic).Val(), "entries stored")
			r.check(nil)
		})
	}
}

// TestACLPartitioned subscribes to and publishes on a partitioned topic as
// the users of the docs' blocks.
func TestACLPartitioned(t *testing.T) {
	const n = 4
	t.Run("Subscriber", func(t *testing.T) {
		testserver.Parallel(t)
		ctx := context.Background()
		r := newACLRun(t)
		topic := aclTopic()
		parts := map[string]int{topic: n}
		r.grant(aclGrant{lines: aclBlock(t, "A Subscriber of a partitioned topic"), names: strings.NewReplacer("orders", topic), checked: true})
		admin := r.e.client
		// What the server holds when the run starts: the messages, a
		// delayed one, an undecodable entry and a departed consumer in
		// the first partition.
		before, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: admin, Partitions: parts}, testLogger())
		require.NoError(t, err)
		var want []string
		for i := range 2 * n {
			m := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
			m.Metadata.Set(valkeystream.MetadataPartitionKey, "key-"+strconv.Itoa(i))
			require.NoError(t, before.Publish(topic, m))
			want = append(want, m.UUID)
		}
		later := message.NewMessage(watermill.NewUUID(), []byte("later"))
		delay.Message(later, delay.For(time.Hour))
		require.NoError(t, before.Publish(topic, later))
		want = append(want, later.UUID)
		layout, err := partition.NewLayout(topic, n)
		require.NoError(t, err)
		for _, stream := range layout.Streams() {
			makeDue(t, admin, stream)
		}
		first := layout.Stream(0)
		require.NoError(t, admin.XAdd(ctx, &redis.XAddArgs{Stream: first, Values: []any{"not", "a message"}}).Err())
		require.NoError(t, admin.XGroupCreateMkStream(ctx, first, "g", "0").Err())
		require.NoError(t, admin.XGroupCreateConsumer(ctx, first, "g", "departed").Err())
		r.start()

		app := r.client()
		cfg := aclSubscriberConfig(app, false)
		cfg.Partitions = parts
		cfg.PartitionOwnerTTL = 900 * time.Millisecond
		var subs []*valkeystream.Subscriber
		var chans []<-chan *message.Message
		for i := range 2 {
			c := cfg
			if i == 1 {
				c.Partitions = nil // finds the count on the server
			}
			sub, err := valkeystream.NewSubscriber(c, testLogger())
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			msgs, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			subs = append(subs, sub)
			chans = append(chans, msgs)
		}
		deliveries := merge(chans...)
		acked := map[string]bool{}
		nacked, held := false, false
		for len(acked) < len(want) {
			m := receive(t, deliveries)
			switch {
			case !nacked:
				nacked = true
				m.Nack()
				continue
			case !held:
				held = true
				r.waitSent("xrange", "pexpire") // hold beats and renewals while it is held
			}
			acked[m.UUID] = true
			m.Ack()
		}
		r.waitSent("xgroup|delconsumer")
		waitUntil(t, "the undecodable entry dead-lettered", func() bool {
			return subs[0].Stats().InvalidEntries+subs[1].Stats().InvalidEntries == 1
		})
		for _, s := range subs {
			require.NoError(t, s.Close())
		}
		for i, s := range subs {
			r.noteFaults(fmt.Sprintf("Subscriber %d", i), s.Stats().Faults)
			if f := s.PartitionStats().Fenced; f > 0 {
				t.Logf("Subscriber %d lost %d ownerships (a refused call would be in the ACL LOG; a stall past PartitionOwnerTTL is not one)", i, f)
			}
		}
		r.check(map[string]string{"xinfo|groups": notOnAFullServer})
		assert.Equal(t, int64(1), admin.XLen(ctx, topic+valkeystream.DefaultDeadLetterSuffix).Val(), "dead letters")
	})
	t.Run("Publisher", func(t *testing.T) {
		testserver.Parallel(t)
		r := newACLRun(t)
		r.uses = map[string]bool{"delayed messages": true}
		topic := aclTopic()
		parts := map[string]int{topic: n}
		r.grant(aclGrant{lines: aclBlock(t, "A Publisher of a partitioned topic"), names: strings.NewReplacer("orders", topic), checked: true})
		// Another side declared the topic before: the usual order.
		require.NoError(t, declareByPublish(r.e.client, topic, parts))
		r.start()

		pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: r.client(), Partitions: parts}, testLogger())
		require.NoError(t, err)
		m := message.NewMessage(watermill.NewUUID(), []byte("now"))
		m.Metadata.Set(valkeystream.MetadataPartitionKey, "order-1")
		require.NoError(t, pub.Publish(topic, m))
		later := message.NewMessage(watermill.NewUUID(), []byte("later"))
		delay.Message(later, delay.For(time.Hour))
		require.NoError(t, pub.Publish(topic, later))
		require.NoError(t, pub.Close())
		assert.Zero(t, pub.Stats().FailedCalls, "every Publish must be allowed")
		r.check(nil)
	})
}

// declareByPublish stores the partition count of topic on the server, as
// a first Publish does, through client.
func declareByPublish(client redis.UniversalClient, topic string, parts map[string]int) error {
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: client, Partitions: parts}, nil)
	if err != nil {
		return err
	}
	defer pub.Close()
	m := message.NewMessage(watermill.NewUUID(), nil)
	return pub.Publish(topic, m)
}

// TestACLExactlyOnce runs an ExactlyOnce handler, with a Deduplicator
// around it, as the user of the Subscriber's block for its input, the
// Publisher's for its output and the lines the docs add for the step.
func TestACLExactlyOnce(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	r := newACLRun(t)
	r.uses = map[string]bool{"DeleteAcked": r.srv.verbs.AckDel, "delayed messages": true, "WaitReplicas": false,
		"the DeadLetter middleware's Publisher": false, "a Deduplicator": true}
	in, out := aclTopic(), aclTopic()
	r.grant(aclGrant{lines: aclBlock(t, "A consumer-group Subscriber"), names: strings.NewReplacer("orders", in)},
		aclGrant{lines: aclBlock(t, "A Publisher"), names: strings.NewReplacer("orders", out)},
		aclGrant{lines: aclExtra(t, "Exactly-once outputs"), names: strings.NewReplacer("orders", in, "enriched", out), checked: true})
	input := message.NewMessage(watermill.NewUUID(), []byte("placed"))
	before := r.e.publisher()
	require.NoError(t, before.Publish(in, input))
	require.NoError(t, before.Publish(in, input), "a copy, which the Deduplicator skips")
	r.start()

	app := r.client()
	sub, pub, x := r.exactlyOnce(app)
	const running = 300 * time.Millisecond
	dedup, err := valkeystream.NewDeduplicator(valkeystream.DedupConfig{Client: app, RunningTTL: running}, testLogger())
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: receiveTimeout}, testLogger())
	require.NoError(t, err)
	var attempts atomic.Int64
	router.AddHandler("enrich", in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
		if attempts.Add(1) == 1 {
			return nil, errors.New("not yet") // the Deduplicator releases its in-progress mark
		}
		// Held until the Deduplicator renewed its in-progress mark: its
		// time to live grows back.
		mark := valkeystream.DefaultDedupKeyPrefix + in + ":g:" + msg.UUID
		least := running
		for deadline := time.Now().Add(receiveTimeout); ; time.Sleep(5 * time.Millisecond) { // the poll of a wait until the deadline
			ttl := r.e.client.PTTL(ctx, mark).Val()
			if least = min(least, ttl); ttl > least+running/10 {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the in-progress mark %s was not renewed within %s", mark, receiveTimeout)
			}
		}
		later := message.NewMessage(watermill.NewUUID(), msg.Payload)
		delay.Message(later, delay.For(time.Hour))
		later.SetContext(msg.Context())
		if err := pub.Publish(out, later); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	}).AddMiddleware(dedup.Middleware, x.Middleware)
	r.e.startRouter(router)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("handler attempts %d; ExactlyOnce %+v; Deduplicator %+v; Subscriber %+v",
				attempts.Load(), x.Stats(), dedup.Stats(), sub.Stats())
		}
	})
	waitUntil(t, "the step committed and the copy skipped", func() bool {
		return x.Stats().Committed == 1 && dedup.Stats().Skipped == 1
	})
	require.NoError(t, router.Close())

	xs := x.Stats()
	assert.Zero(t, xs.Failed+xs.Refused+xs.NonAtomic, "steps that did not commit: %+v", xs)
	r.noteFaults("Deduplicator", dedup.Stats().Faults)
	r.noteFaults("Subscriber", sub.Stats().Faults)
	r.check(nil)
	assert.Equal(t, int64(1), r.e.client.XLen(ctx, out).Val(), "outputs written")
	delayedKey, err := valkeystream.DelayedKey(out)
	require.NoError(t, err)
	assert.Equal(t, int64(1), r.e.client.ZCard(ctx, delayedKey).Val(), "delayed outputs waiting")
}

// exactlyOnce returns a Subscriber, a Publisher and an ExactlyOnce on the
// run user's client app.
func (r *aclRun) exactlyOnce(app *redis.Client) (*valkeystream.Subscriber, *valkeystream.Publisher, *valkeystream.ExactlyOnce) {
	r.t.Helper()
	sub, err := valkeystream.NewSubscriber(aclSubscriberConfig(app, r.uses["DeleteAcked"]), testLogger())
	require.NoError(r.t, err)
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: app}, testLogger())
	require.NoError(r.t, err)
	x, err := valkeystream.NewExactlyOnce(valkeystream.ExactlyOnceConfig{Publisher: pub}, testLogger())
	require.NoError(r.t, err)
	return sub, pub, x
}

// TestACLExactlyOnceStateWrites runs a handler that adds every kind of
// state write and both expectations to its step, as the user of the docs'
// Subscriber, Publisher, Exactly-once and Exactly-once state writes blocks.
func TestACLExactlyOnceStateWrites(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	r := newACLRun(t)
	r.uses = map[string]bool{"DeleteAcked": r.srv.verbs.AckDel, "delayed messages": false, "WaitReplicas": false,
		"the DeadLetter middleware's Publisher": false, "a Deduplicator": false,
		"expectations and increments": true}
	in, out, accounts := aclTopic(), aclTopic(), aclTopic()
	r.grant(aclGrant{lines: aclBlock(t, "A consumer-group Subscriber"), names: strings.NewReplacer("orders", in)},
		aclGrant{lines: aclBlock(t, "A Publisher"), names: strings.NewReplacer("orders", out)},
		aclGrant{lines: aclExtra(t, "Exactly-once outputs"), names: strings.NewReplacer("orders", in, "enriched", out)},
		aclGrant{lines: aclExtra(t, "Exactly-once state writes"), names: strings.NewReplacer("accounts", accounts), checked: true})
	require.NoError(t, r.e.publisher().Publish(in, message.NewMessage(watermill.NewUUID(), []byte("placed"))))
	r.start()

	app := r.client()
	sub, pub, x := r.exactlyOnce(app)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: receiveTimeout}, testLogger())
	require.NoError(t, err)
	k := func(name string) string { return accounts + ":" + name }
	router.AddHandler("apply", in, sub, out, pub, func(msg *message.Message) ([]*message.Message, error) {
		s, err := valkeystream.StepOf(msg.Context())
		if err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, errors.Join(
			s.Expect(k("version"), ""), s.ExpectField(k("hash"), "version", ""),
			s.Set(k("string"), "v", time.Hour), s.Del(k("gone")), s.Expire(k("string"), time.Hour),
			s.IncrBy(k("version"), 1),
			s.HSet(k("hash"), "f", "v"), s.HIncrBy(k("hash"), "version", 1), s.HDel(k("hash"), "f"),
			s.ZAdd(k("zset"), 1, "m"), s.ZRem(k("zset"), "other"),
			s.SAdd(k("set"), "m"), s.SRem(k("set"), "other"),
		)
	}).AddMiddleware(x.Middleware)
	r.e.startRouter(router)
	waitUntil(t, "the step committed", func() bool { return x.Stats().Committed == 1 })
	require.NoError(t, router.Close())

	xs := x.Stats()
	assert.Zero(t, xs.Failed+xs.Refused+xs.NonAtomic+xs.StateChanged, "steps that did not commit: %+v", xs)
	assert.Equal(t, int64(11), xs.StateWrites)
	r.noteFaults("Subscriber", sub.Stats().Faults)
	r.check(nil)
	assert.Equal(t, "1", r.e.client.Get(ctx, k("version")).Val())
	assert.Equal(t, map[string]string{"version": "1"}, r.e.client.HGetAll(ctx, k("hash")).Val())
}
