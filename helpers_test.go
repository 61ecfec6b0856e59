package valkeystream_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

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
// maxKeptErrors of them) and passes every line on to next.
type errorLog struct {
	next   watermill.LoggerAdapter
	shared *errorLines
}

type errorLines struct {
	mu    sync.Mutex
	count int64
	lines []string
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

func (l *errorLog) Info(msg string, fields watermill.LogFields)  { l.next.Info(msg, fields) }
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

// first returns the first n Error lines, for failure messages.
func (l *errorLog) first(n int) string {
	lines := l.lines()
	return strings.Join(lines[:min(n, len(lines))], "; ")
}
