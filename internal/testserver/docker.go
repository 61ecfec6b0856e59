package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

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
func startDocker(pool *dockertest.Pool, logf func(string, ...any)) (*Server, error) {
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
	s := &Server{
		kind: kindDocker,
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		port: port,
		pool: pool,
		res:  res,
		logf: logf,
	}
	if err := s.waitContainer(); err != nil {
		s.shutdownContainer()
		return nil, err
	}
	if err := s.loadInfo(); err != nil {
		s.shutdownContainer()
		return nil, err
	}
	return s, nil
}

// waitContainer waits until the container's server answers PING.
func (s *Server) waitContainer() error {
	err := s.pool.Retry(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return ping(ctx, s.addr)
	})
	if err != nil {
		return fmt.Errorf("container %s at %s did not answer PING: %w", shortID(s.res.Container.ID), s.addr, err)
	}
	return nil
}

func (s *Server) killContainer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	id := s.res.Container.ID
	err := s.pool.Client.KillContainer(dc.KillContainerOptions{ID: id, Signal: dc.SIGKILL})
	var notRunning *dc.ContainerNotRunning
	if err != nil && !errors.As(err, &notRunning) {
		return fmt.Errorf("kill container %s: %w", shortID(id), err)
	}
	if _, err := s.pool.Client.WaitContainer(id); err != nil {
		return fmt.Errorf("wait for container %s: %w", shortID(id), err)
	}
	return nil
}

func (s *Server) startContainerAgain() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	id := s.res.Container.ID
	err := s.pool.Client.StartContainer(id, nil)
	var running *dc.ContainerAlreadyRunning
	if err != nil && !errors.As(err, &running) {
		return fmt.Errorf("start container %s: %w", shortID(id), err)
	}
	return s.waitContainer()
}

func (s *Server) shutdownContainer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if err := s.pool.Purge(s.res); err != nil {
		s.log("testserver: purge container %s: %v", shortID(s.res.Container.ID), err)
	}
}
