package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

func TestWatchProvesAHolderAliveOnlyByARenewalOrANewHolder(t *testing.T) {
	type poll struct {
		holder string
		pttl   int64
		want   verdict
	}
	tests := []struct {
		name  string
		polls []poll
	}{
		{name: "a shrinking lease proves nothing", polls: []poll{
			{"a", 9000, holderUnproven}, {"a", 8500, holderUnproven}, {"a", 8500, holderUnproven}, {"a", 10, holderUnproven}}},
		{name: "a renewal proves the holder alive", polls: []poll{
			{"a", 9000, holderUnproven}, {"a", 8000, holderUnproven}, {"a", 9990, holderAlive}}},
		{name: "a new holder is alive", polls: []poll{
			{"a", 100, holderUnproven}, {"b", 50, holderAlive}}},
		{name: "a lease without expiry never lapses", polls: []poll{
			{"a", -1, holderForever}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w watch
			for i, p := range tt.polls {
				if got := w.observe(p.holder, p.pttl); got != p.want {
					t.Fatalf("poll %d (%s, %d ms): got verdict %d, want %d", i, p.holder, p.pttl, got, p.want)
				}
			}
		})
	}
}

// A name that a lease of this process holds is alive without watching it:
// the next search takes the next name. A name held by a key without expiry
// is skipped too.
func TestTakeSkipsNamesOfThisProcessAndLeasesWithoutExpiry(t *testing.T) {
	testserver.Parallel(t)
	// No keeper renews these leases: without knowing its siblings, a search
	// would wait up to the TTL for each, well past this context.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := newLeaseEnv(t, time.Hour)
	require.NoError(t, e.client.Set(ctx, Key("s", "g", "worker-3"), "forever", 0).Err())

	a, err := e.first(t).Take(ctx)
	require.NoError(t, err)
	assert.Equal(t, "worker", a.Name())
	assert.True(t, isLiveToken(a.token), "a taken lease's token is live")

	b, err := e.first(t).Take(ctx)
	require.NoError(t, err)
	assert.Equal(t, "worker-2", b.Name())

	c, err := e.first(t).Take(ctx)
	require.NoError(t, err)
	assert.Equal(t, "worker-4", c.Name(), "worker-3 never expires")

	for _, l := range []*Lease{a, b, c} {
		got, err := e.client.Get(ctx, l.key).Result()
		require.NoError(t, err)
		assert.Equal(t, l.token, got, "the key of %s holds its token", l.name)
		ttl := e.client.PTTL(ctx, l.key).Val()
		assert.True(t, ttl > 0 && ttl <= time.Hour, "the key of %s has the TTL: got %s", l.name, ttl)
	}
}

// A subscription that does not start gives up the lease its pipeline took:
// the key is deleted and its token is no longer live, so the name is free
// at once, in this process too.
func TestAbandonFreesTheNameThePipelineTook(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newLeaseEnv(t, time.Minute)

	f := e.first(t)
	require.Equal(t, f.lease.token, e.client.Get(ctx, Key("s", "g", "worker")).Val(), "the pipeline took the lease")
	f.Abandon()
	assert.Zero(t, e.client.Exists(ctx, Key("s", "g", "worker")).Val(), "Abandon deleted the lease")
	assert.False(t, isLiveToken(f.lease.token))

	// One that did not take it leaves the holder's key alone.
	require.NoError(t, e.client.Set(ctx, Key("s", "g", "worker"), "other", time.Minute).Err())
	f = e.first(t)
	f.Abandon()
	assert.Equal(t, "other", e.client.Get(ctx, Key("s", "g", "worker")).Val())
	assert.False(t, isLiveToken(f.lease.token))
	assert.Zero(t, e.faults.Load())
}

// A name leased elsewhere, by a live holder or a dead one, is skipped at
// once: Take never waits for a lease to lapse (the Adopter takes over a
// dead holder's entries).
func TestTakeSkipsANameLeasedElsewhereAtOnce(t *testing.T) {
	testserver.Parallel(t)
	ctx := context.Background()
	e := newLeaseEnv(t, 10*time.Second)
	require.NoError(t, e.client.Set(ctx, Key("s", "g", "worker"), "dead", time.Minute).Err())

	l, err := e.first(t).Take(ctx)
	require.NoError(t, err)
	assert.Equal(t, "worker-2", l.Name())
	assert.Equal(t, l.token, e.client.Get(ctx, l.key).Val())
	assert.Equal(t, "dead", e.client.Get(ctx, Key("s", "g", "worker")).Val(), "the other lease is left alone")
}

// Take ends with its context and hands the failure to Deps.TakeError with
// the name it was taking: the pipeline's try of the base name found it
// leased, and the try of the next one could not be sent.
func TestTakeEndsWithItsContext(t *testing.T) {
	testserver.Parallel(t)
	e := newLeaseEnv(t, time.Minute)
	var named string
	e.deps.TakeError = func(name string, err error) error {
		named = name
		return err
	}
	require.NoError(t, e.client.Set(context.Background(), Key("s", "g", "worker"), "dead", time.Minute).Err())
	f := e.first(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.Take(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, "worker-2", named)
	assert.False(t, isLiveToken(f.lease.token), "a lease not taken is forgotten")
}

// reply is a server error reply, as go-redis returns it.
type reply string

func (r reply) Error() string { return string(r) }
func (r reply) RedisError()   {}

// The full server's refusal, as Redis 7 and later answer it, and as Redis
// 6.2 wraps it when a script's write is refused.
func TestIsOOM(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{reply("OOM command not allowed when used memory > 'maxmemory'."), true},
		{reply("ERR Error running script (call to f_99): @user_script:2: @user_script: 2: -OOM command not allowed when used memory > 'maxmemory'."), true},
		{reply("NOPERM this user has no permissions to run the 'set' command"), false},
		{errors.New("OOM in a message that is not a reply"), false},
		{nil, false},
	} {
		if got := isOOM(tt.err); got != tt.want {
			t.Errorf("isOOM(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
