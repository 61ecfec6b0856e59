package testserver

import (
	"sync"
	"testing"
)

// testLog passes messages to a test's Logf (and failures to its Errorf)
// until it is turned off. A supervisor goroutine may still report something
// after the test has completed, when t.Logf would panic; turned off, testLog
// drops it.
type testLog struct {
	mu     sync.Mutex
	logf   func(format string, args ...any) // nil once turned off
	errorf func(format string, args ...any) // nil once turned off, or for none
}

// newTestLog reports to t, or nowhere when t is nil.
func newTestLog(t testing.TB) *testLog {
	if t == nil {
		return &testLog{}
	}
	return &testLog{logf: t.Logf, errorf: t.Errorf}
}

// printf reports through the test's Logf, or drops the message once off.
func (l *testLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.logf != nil {
		l.logf(format, args...)
	}
}

// failf fails the test with the message, or drops it once off.
func (l *testLog) failf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errorf != nil {
		l.errorf(format, args...)
	}
}

// off drops every later message.
func (l *testLog) off() {
	l.mu.Lock()
	l.logf, l.errorf = nil, nil
	l.mu.Unlock()
}
