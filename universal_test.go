package valkeystream_test

import (
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// universalSuite runs Watermill's universal suite as tests.TestPubSub does
// (each test function a parallel subtest under its name, then the consumer
// group test), with one difference: it leaves out tests.TestMessageCtx.
//
// The module requires the oldest Watermill it supports (go.mod), and that
// version's TestMessageCtx publishes a message whose context is already
// cancelled and expects the Publish to succeed. A Publisher of this package
// honours each message's context and refuses it (TestPublishUsesTheMessageContext);
// Watermill 1.5 dropped that expectation. The whole suite of the newest
// Watermill, TestMessageCtx included, runs in the compat module
// (compat/universal_test.go), which requires it.
func universalSuite(
	t *testing.T,
	features tests.Features,
	pubSub tests.PubSubConstructor,
	groupPubSub tests.ConsumerGroupPubSubConstructor,
) {
	t.Helper()
	funcs := []struct {
		fn       func(*testing.T, tests.TestContext, tests.PubSubConstructor)
		parallel bool
	}{
		{tests.TestPublishSubscribe, true},
		{tests.TestConcurrentSubscribe, true},
		{tests.TestConcurrentSubscribeMultipleTopics, true},
		{tests.TestResendOnError, true},
		{tests.TestNoAck, true},
		{tests.TestContinueAfterSubscribeClose, true},
		{tests.TestConcurrentClose, true},
		{tests.TestContinueAfterErrors, true},
		{tests.TestPublishSubscribeInOrder, true},
		{tests.TestPublisherClose, true},
		{tests.TestTopic, true},
		{tests.TestSubscribeCtx, true},
		{tests.TestNewSubscriberReceivesOldMessages, true},
		{tests.TestReconnect, false},
	}
	for _, f := range funcs {
		runUniversalTest(t, funcName(f.fn), features, f.parallel, func(t *testing.T, tc tests.TestContext) {
			f.fn(t, tc, pubSub)
		})
	}
	runUniversalTest(t, funcName(tests.TestConsumerGroups), features, true, func(t *testing.T, tc tests.TestContext) {
		tests.TestConsumerGroups(t, tc, groupPubSub)
	})
}

// runUniversalTest runs one test of the suite the way the suite's own
// runner does: a subtest named after the function, and inside it one named
// after a fresh test ID, which the suite's functions use in topic names.
func runUniversalTest(t *testing.T, name string, features tests.Features, parallel bool, fn func(*testing.T, tests.TestContext)) {
	t.Run(name, func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		id := tests.NewTestID()
		t.Run(string(id), func(t *testing.T) {
			fn(t, tests.TestContext{TestID: id, Features: features})
		})
	})
}

// funcName is the unqualified name of a function: "TestPublishSubscribe".
func funcName(fn any) string {
	full := runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
	return full[strings.LastIndex(full, ".")+1:]
}
