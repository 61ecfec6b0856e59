package valkeystream_test

import (
	"context"
	"fmt"
	"os"
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

// testLogger logs nothing unless VALKEYSTREAM_TEST_LOG is set ("debug" for
// more).
func testLogger() watermill.LoggerAdapter {
	switch os.Getenv("VALKEYSTREAM_TEST_LOG") {
	case "":
		return watermill.NopLogger{}
	case "debug":
		return watermill.NewStdLogger(true, false)
	default:
		return watermill.NewStdLogger(false, false)
	}
}

// newClient returns a client of srv that is closed when the test ends.
func newClient(t testing.TB, srv *testserver.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// errorLog counts and keeps the Error lines of a logger (the first
// maxKeptErrors of them), keeps its Info lines too (as many), and passes
// every line on to next.
type errorLog struct {
	next   watermill.LoggerAdapter
	shared *errorLines
}

type errorLines struct {
	mu    sync.Mutex
	count int64
	lines []string
	infos []string
}

const maxKeptErrors = 1000

func newErrorLog(next watermill.LoggerAdapter) *errorLog {
	return &errorLog{next: next, shared: &errorLines{}}
}

func (l *errorLog) Error(msg string, err error, fields watermill.LogFields) {
	l.shared.mu.Lock()
	l.shared.count++
	if len(l.shared.lines) < maxKeptErrors {
		l.shared.lines = append(l.shared.lines, fmt.Sprintf("%s: %v %v", msg, err, fields))
	}
	l.shared.mu.Unlock()
	l.next.Error(msg, err, fields)
}

func (l *errorLog) Info(msg string, fields watermill.LogFields) {
	l.shared.mu.Lock()
	if len(l.shared.infos) < maxKeptErrors {
		l.shared.infos = append(l.shared.infos, fmt.Sprintf("%s: %v", msg, fields))
	}
	l.shared.mu.Unlock()
	l.next.Info(msg, fields)
}
func (l *errorLog) Debug(msg string, fields watermill.LogFields) { l.next.Debug(msg, fields) }
func (l *errorLog) Trace(msg string, fields watermill.LogFields) { l.next.Trace(msg, fields) }

func (l *errorLog) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &errorLog{next: l.next.With(fields), shared: l.shared}
}

// errors returns how many Error lines were logged.
func (l *errorLog) errors() int64 {
	l.shared.mu.Lock()
	defer l.shared.mu.Unlock()
	return l.shared.count
}

// lines returns the Error lines kept.
func (l *errorLog) lines() []string {
	l.shared.mu.Lock()
	defer l.shared.mu.Unlock()
	return append([]string(nil), l.shared.lines...)
}

// infoLines returns the Info lines kept.
func (l *errorLog) infoLines() []string {
	l.shared.mu.Lock()
	defer l.shared.mu.Unlock()
	return append([]string(nil), l.shared.infos...)
}

// first returns the first n Error lines, for failure messages.
func (l *errorLog) first(n int) string {
	lines := l.lines()
	return strings.Join(lines[:min(n, len(lines))], "; ")
}

// receiveTimeout bounds every wait for a message that must arrive. It is a
// deadline for a hang, not a speed requirement.
const receiveTimeout = 20 * time.Second

// waitGrowing waits until count reaches n, for as long as it keeps growing:
// it fails the test when count stays the same for receiveTimeout (a hang,
// or entries nobody delivers), or when it has not reached n within
// growingBound. what names what count counts, for the failure message.
// It is for waits whose length is the machine's pace times a number of
// messages, which a fixed receiveTimeout would turn into a speed
// requirement on a loaded machine.
func waitGrowing(t *testing.T, count func() int, n int, what string) {
	t.Helper()
	start := time.Now()
	last, since := count(), start
	poll := time.NewTicker(10 * time.Millisecond) // count has no event to wait on: it is read each tick
	defer poll.Stop()
	for last < n {
		now := <-poll.C
		switch c := count(); {
		case c != last:
			last, since = c, now
		case now.Sub(since) >= receiveTimeout:
			t.Fatalf("%s: %d of %d, none more for %s", what, c, n, receiveTimeout)
		}
		if last < n && now.Sub(start) >= growingBound {
			t.Fatalf("%s: %d of %d after %s", what, last, n, growingBound)
		}
	}
}

// growingBound bounds a wait of waitGrowing as a whole: a bound against a
// loop that keeps delivering and never gets there, far above what a loaded
// machine takes.
const growingBound = 3 * time.Minute

// assertTimings is set in stress runs (-tags stress, meant for a quiet
// machine): the tests then also fail on the wall-clock bounds they
// otherwise only log, which a loaded machine may exceed.
var assertTimings = false

// shortTopologySuites runs Watermill's universal suite in its short form
// (ForceShort: 100 messages where it sends 5 000, 5 Nacks where it sends
// 300) on the cluster, the Sentinel group and the partitioned topics of
// several keys; the plain topics (TestPubSub, TestPubSubFanOut) and the
// partitioned topic of one key (TestPubSubPartitionedOneKey) run it in
// full. Every test of the suite runs on every topology either way; the
// volume is the plain topics' and the crash audits'. Stress runs (-tags
// stress) run the full form everywhere.
var shortTopologySuites = true

// env is one test's server, client and topic.
type env struct {
	t      *testing.T
	srv    *testserver.Server
	client *redis.Client
	topic  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := testserver.Start(t)
	return &env{t: t, srv: srv, client: newClient(t, srv), topic: "topic-" + watermill.NewShortUUID()}
}

// subscriber returns a consumer-group Subscriber on the env's client, closed
// when the test ends. edit adjusts the config.
func (e *env) subscriber(group, consumer string, edit ...func(*valkeystream.SubscriberConfig)) *valkeystream.Subscriber {
	e.t.Helper()
	cfg := valkeystream.SubscriberConfig{
		Client:        e.client,
		ConsumerGroup: group,
		Consumer:      consumer,
		Start:         valkeystream.StartHead,
	}
	for _, f := range edit {
		f(&cfg)
	}
	sub, err := valkeystream.NewSubscriber(cfg, testLogger())
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func (e *env) subscribe(sub *valkeystream.Subscriber) <-chan *message.Message {
	e.t.Helper()
	return e.subscribeTo(sub, e.topic)
}

// subscribeTo subscribes sub to topic, failing the test if it cannot.
func (e *env) subscribeTo(sub *valkeystream.Subscriber, topic string) <-chan *message.Message {
	e.t.Helper()
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(e.t, err)
	return msgs
}

// publish publishes n messages with payloads "0".."n-1" and returns them.
func (e *env) publish(n int) []*message.Message {
	e.t.Helper()
	pub, err := valkeystream.NewPublisher(valkeystream.PublisherConfig{Client: e.client}, testLogger())
	require.NoError(e.t, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
	}
	require.NoError(e.t, pub.Publish(e.topic, msgs...))
	return msgs
}

func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-msgs:
		require.True(t, ok, "channel closed, want a message")
		return m
	case <-time.After(receiveTimeout):
		t.Fatalf("no message within %s", receiveTimeout)
		return nil
	}
}

// receiveAll receives n messages, acking each, and returns their UUIDs.
func receiveAll(t *testing.T, msgs <-chan *message.Message, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		m := receive(t, msgs)
		ids = append(ids, m.UUID)
		m.Ack()
	}
	return ids
}

// expectNothing fails if a message arrives within d.
func expectNothing(t *testing.T, msgs <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if ok {
			t.Fatalf("got message %s (payload %q), want none", m.UUID, m.Payload)
		}
	case <-time.After(d):
	}
}

func (e *env) pending(group string) []redis.XPendingExt {
	e.t.Helper()
	p, err := e.client.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: e.topic, Group: group, Start: "-", End: "+", Count: 1000}).Result()
	require.NoError(e.t, err)
	return p
}

func uuidsOf(msgs []*message.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	return ids
}

// shortClaim makes a peer reclaim quickly; the shipped ClaimMinIdle of 30 s
// would make this test wait that long.
func shortClaim(c *valkeystream.SubscriberConfig) {
	c.BlockTime = 50 * time.Millisecond
	c.ClaimInterval = 50 * time.Millisecond
	c.ClaimMinIdle = 300 * time.Millisecond
	c.AckFlushInterval = 10 * time.Millisecond
}

// collect gathers what a peer receives, acking it, until the test ends.
func collect(t *testing.T, msgs <-chan *message.Message) func() []*message.Message {
	var mu sync.Mutex
	var got []*message.Message
	go func() {
		for m := range msgs {
			mu.Lock()
			got = append(got, m)
			mu.Unlock()
			m.Ack()
		}
	}()
	return func() []*message.Message {
		mu.Lock()
		defer mu.Unlock()
		return append([]*message.Message(nil), got...)
	}
}

// leaseClaim makes a peer reclaim within seconds while leaving a renewal
// (every ClaimMinIdle/3 = 500 ms) a second of slack, so that a loaded machine
// that delays one hold beat does not hand a live entry to the peer.
func leaseClaim(c *valkeystream.SubscriberConfig) {
	shortClaim(c)
	c.ClaimMinIdle = 1500 * time.Millisecond
}

// receiveEntryID finds the stream entry id of a published message.
func receiveEntryID(t *testing.T, e *env, uuid string) string {
	t.Helper()
	entries, err := e.client.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	for _, en := range entries {
		if en.Values[valkeystream.FieldUUID] == uuid {
			return en.ID
		}
	}
	t.Fatalf("no entry holds message %s", uuid)
	return ""
}

// processHook is a redis.Hook that wraps single commands and lets dials and
// pipelines through.
type processHook func(next redis.ProcessHook) redis.ProcessHook

func (h processHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h processHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return h(next) }
func (h processHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// pipelineHook is a redis.Hook that wraps pipelines (Subscribe sends its
// door, script check and lease in one) and lets dials and single commands
// through.
type pipelineHook func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook

func (h pipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return h(next)
}

// watchCommands calls see with every command client sends: a single one,
// or the commands of a pipeline together, before they are sent.
func watchCommands(client *redis.Client, see func(cmds ...redis.Cmder)) {
	client.AddHook(processHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			see(cmd)
			return next(ctx, cmd)
		}
	}))
	client.AddHook(pipelineHook(func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			see(cmds...)
			return next(ctx, cmds)
		}
	}))
}

// isScript reports whether cmd runs a server-side script (EVALSHA, EVAL).
func isScript(cmd redis.Cmder) bool {
	return cmd.Name() == "evalsha" || cmd.Name() == "eval"
}

// isStreamScript reports whether cmd runs a script on the stream key alone:
// the hold renewal or the Nack claim, not a consumer name's lease (its own
// key) nor a move of delayed messages (two keys).
func isStreamScript(cmd redis.Cmder, key string) bool {
	args := cmd.Args()
	return isScript(cmd) && len(args) > 3 && fmt.Sprint(args[2]) == "1" && args[3] == key
}

// fastRedelivery brings a Nacked message back within milliseconds and keeps
// Close and Ack flushes quick; the shipped defaults work too, only slower.
func fastRedelivery(c *valkeystream.SubscriberConfig) {
	c.NackResendDelay = 5 * time.Millisecond
	c.BlockTime = 50 * time.Millisecond
	c.AckFlushInterval = 10 * time.Millisecond
}

// runRouter runs a Watermill router with one handler on e.topic. mw is added
// to the handler in order: the first is the outermost. The router (and so
// sub) is closed by the returned stop, or when the test ends.
func (e *env) runRouter(sub message.Subscriber, h message.NoPublishHandlerFunc, mw ...message.HandlerMiddleware) (stop func()) {
	e.t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: receiveTimeout}, testLogger())
	require.NoError(e.t, err)
	router.AddNoPublisherHandler("handler", e.topic, sub, h).AddMiddleware(mw...)
	return e.startRouter(router)
}

// startRouter runs router until the returned stop, or the test's end.
func (e *env) startRouter(router *message.Router) (stop func()) {
	e.t.Helper()
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		e.t.Fatalf("router stopped before running: %v", err)
	case <-time.After(receiveTimeout):
		e.t.Fatalf("router not running within %s", receiveTimeout)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(e.t, router.Close())
			require.NoError(e.t, <-done)
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) publisher(edit ...func(*valkeystream.PublisherConfig)) *valkeystream.Publisher {
	e.t.Helper()
	cfg := valkeystream.PublisherConfig{Client: e.client}
	for _, f := range edit {
		f(&cfg)
	}
	pub, err := valkeystream.NewPublisher(cfg, testLogger())
	require.NoError(e.t, err)
	return pub
}

func (e *env) deadLetter(config valkeystream.DeadLetterConfig) message.HandlerMiddleware {
	e.t.Helper()
	mw, err := valkeystream.DeadLetter(config, testLogger())
	require.NoError(e.t, err)
	return mw
}

// stored returns the messages in stream key, decoded with DefaultMarshaler.
func (e *env) stored(key string) []*message.Message {
	e.t.Helper()
	entries, err := e.client.XRange(context.Background(), key, "-", "+").Result()
	require.NoError(e.t, err)
	msgs := make([]*message.Message, len(entries))
	for i, en := range entries {
		msgs[i], err = valkeystream.DefaultMarshaler{}.Unmarshal(en.Values)
		require.NoError(e.t, err, "entry %s of %s", en.ID, key)
	}
	return msgs
}

func (e *env) pendingCount(key, group string) int64 {
	e.t.Helper()
	p, err := e.client.XPending(context.Background(), key, group).Result()
	require.NoError(e.t, err)
	return p.Count
}

// waitUntil polls cond until it holds and fails the test after
// receiveTimeout; what names the awaited state.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(receiveTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, receiveTimeout)
		}
		time.Sleep(5 * time.Millisecond) // the poll interval
	}
}

// commandCounter returns a client of e's server that counts the commands
// named name (lower case, such as "xautoclaim") sent through it that have
// returned, and the count. Pipelined commands are not counted.
func (e *env) commandCounter(name string) (*redis.Client, *atomic.Int64) {
	e.t.Helper()
	c := newClient(e.t, e.srv)
	var n atomic.Int64
	c.AddHook(processHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			if cmd.Name() == name {
				n.Add(1)
			}
			return err
		}
	}))
	return c, &n
}

// streamScripts counts the calls of the stream's scripts (hold beats, Nack
// claims) that e.client's Subscribers have finished.
func (e *env) streamScripts() *atomic.Int64 {
	var n atomic.Int64
	e.client.AddHook(processHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			if isStreamScript(cmd, e.topic) {
				n.Add(1)
			}
			return err
		}
	}))
	return &n
}

// serverCalls returns how many times the server has run the command name
// (INFO commandstats), whichever client sent it.
func (e *env) serverCalls(name string) int64 {
	e.t.Helper()
	return e.serverCallsOf(name)[0]
}

// serverCallsOf is serverCalls of each name, read at one instant (one INFO
// reply), so that commands sent together count in all or none of them.
func (e *env) serverCallsOf(names ...string) []int64 {
	e.t.Helper()
	info, err := e.client.Info(context.Background(), "commandstats").Result()
	require.NoError(e.t, err)
	counts := make([]int64, len(names))
	for _, line := range strings.Split(info, "\n") {
		for i, name := range names {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":calls=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
			require.NoError(e.t, err)
			counts[i] = n
		}
	}
	return counts
}

// onClient makes a Subscriber use client.
func onClient(client *redis.Client) func(*valkeystream.SubscriberConfig) {
	return func(c *valkeystream.SubscriberConfig) { c.Client = client }
}

// readAs reads n new entries of e's topic as consumer of group, creating the
// group at the stream's head if needed, and never acknowledges them: what a
// consumer that read a batch and died leaves behind.
func (e *env) readAs(group, consumer string, n int64) []redis.XMessage {
	e.t.Helper()
	ctx := context.Background()
	if err := e.client.XGroupCreateMkStream(ctx, e.topic, group, "0").Err(); err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		require.NoError(e.t, err)
	}
	streams, err := e.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: group, Consumer: consumer, Streams: []string{e.topic, ">"}, Count: n, Block: -1}).Result()
	require.NoError(e.t, err)
	require.Len(e.t, streams, 1)
	require.Len(e.t, streams[0].Messages, int(n))
	return streams[0].Messages
}

// fullBatches makes a Subscriber read whole batches ahead however slow the
// handler, from its first read on (no byte bound, which reads one entry
// before it knows their size), so that a test can hold entries in its queue.
func fullBatches(c *valkeystream.SubscriberConfig) {
	c.PrefetchWindow = valkeystream.FullBatches
	c.ReadAheadBytes = valkeystream.NoReadAheadLimit
}

// publishAtOnce adds n messages in one MULTI/EXEC, so that a reader blocked
// on the stream wakes up to all of them at once, and returns them.
func (e *env) publishAtOnce(n int) []*message.Message {
	e.t.Helper()
	msgs := make([]*message.Message, n)
	_, err := e.client.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
			values, err := valkeystream.DefaultMarshaler{}.Marshal(e.topic, msgs[i])
			if err != nil {
				return err
			}
			p.XAdd(context.Background(), &redis.XAddArgs{Stream: e.topic, Values: values})
		}
		return nil
	})
	require.NoError(e.t, err)
	return msgs
}
