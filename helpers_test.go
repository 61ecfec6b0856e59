package valkeystream_test

import (
	"os"
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
