package testserver

import "sync"

// testLog passes messages to a test's Logf until it is turned off. A
// supervisor goroutine may still report something after the test has
// completed, when t.Logf would panic; turned off, testLog drops it.
type testLog struct {
	mu   sync.Mutex
	logf func(format string, args ...any) // nil once turned off
}

func newTestLog(logf func(format string, args ...any)) *testLog {
	return &testLog{logf: logf}
}

// printf reports through the test's Logf, or drops the message once off.
func (l *testLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.logf != nil {
		l.logf(format, args...)
	}
}

// off drops every later message.
func (l *testLog) off() {
	l.mu.Lock()
	l.logf = nil
	l.mu.Unlock()
}
