package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// envAddr names an already running server (host:port) to use.
	envAddr = "VALKEYSTREAM_TEST_ADDR"
	// envServer names the server binary (a name looked up on PATH, or a path).
	envServer = "VALKEYSTREAM_TEST_SERVER"

	// readyTimeout bounds how long Start and StartAgain wait for PING.
	readyTimeout = 10 * time.Second
	// restartReadyTimeout bounds how long the supervisor waits for PING
	// after an automatic restart (only used for logging).
	restartReadyTimeout = 5 * time.Second
	// maxQuickFails is how many times in a row the supervisor restarts a
	// process that exited by itself before answering PING, before giving up.
	maxQuickFails = 10

	dockerRepository = "redis"
	dockerTag        = "7.2"
)

var (
	errNotRestartable = errors.New("testserver: server is external (VALKEYSTREAM_TEST_ADDR) and cannot be killed or restarted")
	errClosed         = errors.New("testserver: server has been shut down")
)

// defaultBinaries are looked up on PATH, in order, when VALKEYSTREAM_TEST_SERVER is unset.
var defaultBinaries = []string{"redis-server", "valkey-server"}

type kind int

const (
	kindExternal kind = iota
	kindProcess
	kindDocker
)

// Server is a Redis-protocol server used by one test (or one test binary).
//
// It is either an external server (VALKEYSTREAM_TEST_ADDR), a private server
// process supervised by the test process, or a Docker container. The methods
// are safe for concurrent use.
type Server struct {
	kind    kind
	addr    string // fixed once Start returns
	port    int    // fixed once Start returns; 0 for an external server
	name    string
	version string

	proc *supervisor // the private process, for kindProcess
	box  *container  // the Docker container, for kindDocker
	log  *testLog
}

// Start returns a server for the test and registers its shutdown with
// t.Cleanup. Order of choice:
//
//  1. if VALKEYSTREAM_TEST_ADDR is set (host:port), that server is used as is;
//     it cannot be killed or restarted (Restartable reports false);
//  2. else if a server binary is found (VALKEYSTREAM_TEST_SERVER names a binary
//     or a path, otherwise the first of redis-server and valkey-server found on
//     PATH), a private server process is started on a free 127.0.0.1 port, in
//     a fresh temporary directory, with appendonly yes and appendfsync always;
//  3. else if a Docker engine is reachable, a redis:7.2 container is run with
//     the same persistence settings, published on 127.0.0.1:<free port>;
//  4. else the test fails, saying what to install.
func Start(t testing.TB) *Server {
	t.Helper()

	if addr := os.Getenv(envAddr); addr != "" {
		s, err := startExternal(addr)
		if err != nil {
			t.Fatalf("testserver: %s=%s: %v", envAddr, addr, err)
			return nil
		}
		t.Logf("testserver: using external %s %s at %s (from %s)", s.name, s.version, s.addr, envAddr)
		return s
	}

	bin, err := findBinary()
	if err != nil {
		t.Fatalf("testserver: %v", err)
		return nil
	}
	if bin != "" {
		s, err := startProcess(bin, t, procConfig{})
		if err != nil {
			t.Fatalf("testserver: %v", err)
			return nil
		}
		t.Cleanup(s.shutdown)
		t.Logf("testserver: started %s (%s %s) at %s, dir %s", bin, s.name, s.version, s.addr, s.proc.spec.dir)
		return s
	}

	pool, dockerErr := dockerPool()
	if pool != nil {
		s, err := startDocker(pool, t)
		if err != nil {
			t.Fatalf("testserver: %v", err)
			return nil
		}
		t.Cleanup(s.shutdown)
		t.Logf("testserver: started container %s (%s:%s, %s %s) at %s",
			s.box.id(), dockerRepository, dockerTag, s.name, s.version, s.addr)
		return s
	}

	t.Fatalf("testserver: no Redis-compatible server available. Install one "+
		"(e.g. `apt-get install -y redis-server`, or valkey-server; %s may name the binary), "+
		"set %s=host:port to use a running server, or run a Docker engine (docker: %v)",
		envServer, envAddr, dockerErr)
	return nil
}

// Parallel lets t run alongside the other tests that call it when Start
// gives every test a private server (a process or a container of its own).
// With the shared server of VALKEYSTREAM_TEST_ADDR it does nothing, and the
// tests run one after the other: some change what the whole server does
// (CLIENT PAUSE, CLIENT KILL, CONFIG SET, ACL users), which would disturb
// the tests running beside them. Call it first in the test.
func Parallel(t *testing.T) {
	t.Helper()
	if os.Getenv(envAddr) == "" {
		t.Parallel()
	}
}

// Addr is host:port.
func (s *Server) Addr() string { return s.addr }

// Name describes the server implementation: "redis" or "valkey" (the
// server_name reported by INFO server, "redis" when absent).
func (s *Server) Name() string { return s.name }

// Version is the server's version string (valkey_version for Valkey,
// redis_version otherwise).
func (s *Server) Version() string { return s.version }

// Restartable reports whether Kill, StartAgain, Restart and RestartCommand
// are available, that is whether the server is a private process or a
// container rather than an external server.
func (s *Server) Restartable() bool { return s.kind != kindExternal }

// Kill sends SIGKILL to the private server process (or kills the container)
// and leaves it down until StartAgain. The supervisor does not restart it.
func (s *Server) Kill() error {
	switch s.kind {
	case kindProcess:
		return s.proc.kill()
	case kindDocker:
		return s.box.kill()
	default:
		return errNotRestartable
	}
}

// StartAgain starts the server again on the same port and directory (the
// append-only file is replayed) and waits until it answers PING. For a
// private process it also resumes supervision. It is a no-op, apart from
// waiting for PING, when the server is already up.
func (s *Server) StartAgain() error {
	switch s.kind {
	case kindProcess:
		return s.proc.start()
	case kindDocker:
		return s.box.start()
	default:
		return errNotRestartable
	}
}

// Restart is Kill followed by StartAgain.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.StartAgain()
}

// RestartCommand returns a command line that really restarts the server
// and exits only after the server answers PING again (exit status 0), or
// fails with exit status 1 after about 30 s. It is meant for watermill's
// tests.Features.RestartServiceCommand, which runs it with exec.Command and
// waits for it. The command needs bash (it uses /dev/tcp).
//
// For a private process the command kills the process with SIGKILL; the
// supervisor in the test process then starts it again on the same port and
// directory. For a container it runs `docker restart`. RestartCommand
// returns nil when !Restartable().
func (s *Server) RestartCommand() []string {
	switch s.kind {
	case kindProcess:
		return []string{"bash", "-c", processRestartScript(s.proc.spec.pidFile(), s.port)}
	case kindDocker:
		return []string{"bash", "-c", dockerRestartScript(s.box.res.Container.ID, s.port)}
	default:
		return nil
	}
}

// shutdown is the t.Cleanup function.
func (s *Server) shutdown() {
	switch s.kind {
	case kindProcess:
		s.proc.shutdown()
	case kindDocker:
		s.box.shutdown()
	}
	s.log.off()
}

func startExternal(addr string) (*Server, error) {
	s := &Server{kind: kindExternal, addr: addr, log: newTestLog(nil)}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := waitPing(ctx, addr, 0, nil); err != nil {
		return nil, err
	}
	if err := s.loadInfo(); err != nil {
		return nil, err
	}
	return s, nil
}

// findBinary returns the server binary to run, or "" when none is found
// and VALKEYSTREAM_TEST_SERVER is unset.
func findBinary() (string, error) {
	if name := os.Getenv(envServer); name != "" {
		path, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %w", envServer, name, err)
		}
		return path, nil
	}
	for _, name := range defaultBinaries {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", nil
}

// freePort returns a currently unused TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	return port, nil
}

// newClient returns a client that does not retry by itself: callers poll.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        2,
		DialTimeout:     time.Second,
		DialerRetries:   1,
		ReadTimeout:     time.Second,
		WriteTimeout:    time.Second,
		MaxRetries:      -1,
		PoolSize:        1,
		DisableIdentity: true,
	})
}

// ping sends one PING to addr. It first checks with a plain TCP dial that
// the port accepts connections: go-redis logs every failed dial to stderr
// and, after failed dials, keeps returning the last dial error for up to a
// second, which would make polling slow and noisy.
func ping(ctx context.Context, addr string, pid int) error {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	conn, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return err
	}
	_ = conn.Close()
	c := newClient(addr)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil || pid == 0 {
		return err
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	if got := infoFields(info)["process_id"]; got != strconv.Itoa(pid) {
		return fmt.Errorf("another server (process_id %s, not %d) answers on %s", got, pid, addr)
	}
	return nil
}

// waitPing polls addr with PING every 50 ms until it answers, ctx is done,
// or (when non-nil) stop is closed. With a pid, only the server of that
// process answers: one that a parallel test started on the same port (a
// free port is free for any test until a server binds it) does not.
func waitPing(ctx context.Context, addr string, pid int, stop <-chan struct{}) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ping(ctx, addr, pid)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server at %s did not answer PING: %w", addr, err)
		case <-stop:
			return fmt.Errorf("server at %s stopped before answering PING: %w", addr, err)
		case <-tick.C:
		}
	}
}

// loadInfo fills in name and version from INFO server.
func (s *Server) loadInfo() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := newClient(s.addr)
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("info server at %s: %w", s.addr, err)
	}
	s.name, s.version = parseServerInfo(info)
	return nil
}

// parseServerInfo extracts the server name and version from INFO server.
// Valkey reports server_name:valkey and valkey_version besides the
// compatibility redis_version; Redis has no server_name.
func parseServerInfo(info string) (name, version string) {
	fields := infoFields(info)
	name = fields["server_name"]
	if name == "" {
		name = "redis"
	}
	version = fields[name+"_version"]
	if version == "" {
		version = fields["redis_version"]
	}
	return name, version
}
