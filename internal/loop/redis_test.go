package loop

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream/internal/testserver"
)

// A client that sends the Nack claim again after a network error that hid
// the reply (go-redis does, with MaxRetries) must not grow the delivery
// count twice: the script claims only while the count is still the Nacked
// delivery's.
func TestNackClaimIsIdempotent(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	srv := testserver.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	const key, group, consumer = "s", "g", "c"
	if err := client.XGroupCreateMkStream(ctx, key, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	id, err := client.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"uuid", "u", "payload", "p"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer, Streams: []string{key, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	// Delivery 1 was Nacked: the same call, sent twice.
	for try := 1; try <= 2; try++ {
		reply, err := claimBackScript.Run(ctx, client, []string{key}, group, consumer, id, 1).Slice()
		if err != nil {
			t.Fatalf("try %d: %v", try, err)
		}
		r, err := ParseClaimBack(reply)
		if err != nil {
			t.Fatalf("try %d: %v", try, err)
		}
		if r.Status != "ok" || r.Count != 2 || r.Fields["payload"] != "p" {
			t.Fatalf("try %d: got %+v, want ok with count 2 and the fields", try, r)
		}
	}
	p, err := client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: group, Start: "-", End: "+", Count: 1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].RetryCount != 2 {
		t.Fatalf("pending after two tries: %+v, want one entry with count 2", p)
	}
}
