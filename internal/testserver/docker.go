package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// container is a server run in a Docker container. Its methods are safe
// for concurrent use.
type container struct {
	pool *dockertest.Pool
	res  *dockertest.Resource
	addr string
	log  *testLog

	mu     sync.Mutex
	closed bool
}

// dockerPool returns a pool for a reachable Docker engine, or nil and the
// reason it is not reachable.
func dockerPool() (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, err
	}
	pool.MaxWait = 30 * time.Second
	return pool, nil
}

// startDocker runs a redis container published on 127.0.0.1:<free port>.
// The host port is bound explicitly so that it survives docker restart.
func startDocker(pool *dockertest.Pool, t testing.TB) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: dockerRepository,
		Tag:        dockerTag,
		Cmd: []string{"redis-server",
			"--appendonly", "yes",
			"--appendfsync", "always",
			"--save", "",
			"--protected-mode", "no",
		},
		PortBindings: map[dc.Port][]dc.PortBinding{
			"6379/tcp": {{HostIP: "127.0.0.1", HostPort: strconv.Itoa(port)}},
		},
	}, func(hc *dc.HostConfig) {
		hc.AutoRemove = false
		hc.RestartPolicy = dc.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("run %s:%s container: %w", dockerRepository, dockerTag, err)
	}
	log := newTestLog(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	box := &container{pool: pool, res: res, addr: addr, log: log}
	s := &Server{kind: kindDocker, addr: addr, port: port, box: box, log: log}
	if err := box.wait(); err != nil {
		box.shutdown()
		return nil, err
	}
	if err := s.loadInfo(); err != nil {
		box.shutdown()
		return nil, err
	}
	return s, nil
}

// id is the container's short ID.
func (c *container) id() string { return shortID(c.res.Container.ID) }

// wait waits until the container's server answers PING.
func (c *container) wait() error {
	err := c.pool.Retry(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return ping(ctx, c.addr, 0)
	})
	if err != nil {
		return fmt.Errorf("container %s at %s did not answer PING: %w", c.id(), c.addr, err)
	}
	return nil
}

func (c *container) kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	id := c.res.Container.ID
	err := c.pool.Client.KillContainer(dc.KillContainerOptions{ID: id, Signal: dc.SIGKILL})
	var notRunning *dc.ContainerNotRunning
	if err != nil && !errors.As(err, &notRunning) {
		return fmt.Errorf("kill container %s: %w", c.id(), err)
	}
	if _, err := c.pool.Client.WaitContainer(id); err != nil {
		return fmt.Errorf("wait for container %s: %w", c.id(), err)
	}
	return nil
}

func (c *container) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	err := c.pool.Client.StartContainer(c.res.Container.ID, nil)
	var running *dc.ContainerAlreadyRunning
	if err != nil && !errors.As(err, &running) {
		return fmt.Errorf("start container %s: %w", c.id(), err)
	}
	return c.wait()
}

func (c *container) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if err := c.pool.Purge(c.res); err != nil {
		c.log.printf("testserver: purge container %s: %v", c.id(), err)
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
