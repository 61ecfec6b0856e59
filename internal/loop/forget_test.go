package loop

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A failed call that a failover causes makes the server's verbs be found
// out again (the client may now reach a node of another version); any
// other failure does not.
func TestAFailoverSymptomForgetsTheVerbs(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	forgot := 0
	s := NewRedisServer(client, RedisServerOptions{Key: "s", Group: "g", Consumer: "c",
		ClaimMinIdle: time.Second, BlockTime: 50 * time.Millisecond, Forget: func() { forgot++ }})
	defer s.Interrupt()
	s.Failed(io.EOF, time.Second)
	if forgot != 1 {
		t.Fatalf("after a lost connection: forgot %d times, want 1", forgot)
	}
	s.Failed(errors.New("NOGROUP No such key 's' or consumer group 'g'"), time.Second)
	s.Failed(redis.Nil, time.Second)
	if forgot != 1 {
		t.Fatalf("after replies that are no failover: forgot %d times, want still 1", forgot)
	}
}
