package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A scope owns what one run of one side makes: its clients, publishers and
// subscribers. close releases all of it, newest first.
type scope struct {
	addr    string // the server's, or a delay proxy's in front of it
	clients []*redis.Client
	closers []namedCloser
}

type namedCloser struct {
	what  string
	close func() error
}

func newScope(addr string) *scope { return &scope{addr: addr} }

// client returns a new client of the server (PoolSize poolSize), closed with
// the scope.
func (sc *scope) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: sc.addr, PoolSize: poolSize})
	sc.clients = append(sc.clients, c)
	return c
}

// defaultClient returns a new client of the server with go-redis' default
// options, closed with the scope.
func (sc *scope) defaultClient() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: sc.addr})
	sc.clients = append(sc.clients, c)
	return c
}

// warm opens up to conns connections on every client of the scope (by
// sending that many PINGs at once), so that no side pays for dialling inside
// the timed part.
func (sc *scope) warm(ctx context.Context, conns int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(sc.clients)*conns)
	for i, c := range sc.clients {
		for j := range conns {
			wg.Go(func() { errs[i*conns+j] = c.Ping(ctx).Err() })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("opening connections: %w", err)
	}
	return nil
}

// onClose registers f to run when the scope closes.
func (sc *scope) onClose(what string, f func() error) {
	sc.closers = append(sc.closers, namedCloser{what, f})
}

// close runs the registered closers, newest first, then closes the clients.
// A client that a closer already closed (watermill-redisstream closes the
// client it was given) is not an error.
func (sc *scope) close() error {
	var errs []error
	for i := len(sc.closers) - 1; i >= 0; i-- {
		if err := sc.closers[i].close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the %s: %w", sc.closers[i].what, err))
		}
	}
	for _, c := range sc.clients {
		if err := c.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, fmt.Errorf("closing a client: %w", err))
		}
	}
	sc.closers, sc.clients = nil, nil
	return errors.Join(errs...)
}
