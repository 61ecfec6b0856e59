//go:build unix

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/echomq/valkeystream/internal/testserver"
)

// TestInstallFromAFreshClone runs the shell lines of docs/cli.md's
// "Installing" section, as written, in a fresh clone of this repository:
// go install into a GOBIN of its own put first on PATH, the installed
// command's help, and the one-off go run against a private server (the
// documented address replaced by the server's).
func TestInstallFromAFreshClone(t *testing.T) {
	testserver.Parallel(t)
	srv := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	const stream = "install-check"
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"k", "v"}}).Err())

	lines := installLines(t, "../../docs/cli.md")
	require.GreaterOrEqual(t, len(lines), 3, "docs/cli.md's Installing section: want go install, the installed command and go run")

	clone := freshClone(t, "../..")
	bin := filepath.Join(t.TempDir(), "bin")
	env := append(os.Environ(), "GOBIN="+bin, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"VALKEYSTREAM_ADDR=", "VALKEYSTREAM_URL=", "VALKEYSTREAM_KEY_PREFIX=", "GOFLAGS=")

	var installed, ran bool
	for _, line := range lines {
		line = strings.ReplaceAll(line, "127.0.0.1:6379", srv.Addr())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, "sh", "-c", line)
		cmd.Dir, cmd.Env = clone, env
		out, err := cmd.CombinedOutput()
		cancel()
		require.NoError(t, err, "%s\n%s", line, out)
		switch {
		case strings.HasPrefix(line, "go install"):
			_, err := os.Stat(filepath.Join(bin, "valkeystream"))
			require.NoError(t, err, "%s installed nothing into GOBIN", line)
			installed = true
		case strings.HasPrefix(line, "valkeystream"):
			require.Contains(t, string(out), "Commands:", line)
		case strings.Contains(line, "go run"):
			require.Contains(t, string(out), stream, "%s does not list the server's stream", line)
			ran = true
		}
	}
	require.True(t, installed, "no go install line in the Installing section")
	require.True(t, ran, "no go run line in the Installing section")
}

// installLines returns the commands of the sh blocks in the "Installing"
// section of the Markdown file at path.
func installLines(t *testing.T, path string) []string {
	t.Helper()
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	_, section, found := strings.Cut(string(doc), "\n## Installing\n")
	require.True(t, found, "%s has no Installing section", path)
	section, _, _ = strings.Cut(section, "\n## ")
	var lines []string
	inBlock := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case line == "```sh":
			inBlock = true
		case line == "```":
			inBlock = false
		case inBlock && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#"):
			lines = append(lines, line)
		}
	}
	return lines
}

// freshClone clones the repository at root and returns the clone's
// directory; a tree that is not a git checkout is copied instead. The clone
// is made anew in one place for every run, held under a lock until the test
// ends: the go command's build cache keys a package's compilation by its
// directory, so in the same place a run builds only what changed since the
// last one instead of the whole module.
func freshClone(t *testing.T, root string) string {
	t.Helper()
	root, err := filepath.Abs(root)
	require.NoError(t, err)
	base := filepath.Join(os.TempDir(), "valkeystream-install-test")
	require.NoError(t, os.MkdirAll(base, 0o755))
	lock, err := os.OpenFile(filepath.Join(base, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX), "locking the install test's clone")
	t.Cleanup(func() { _ = lock.Close() }) // releases the lock
	dst := filepath.Join(base, "clone")
	require.NoError(t, os.RemoveAll(dst))
	var cmd *exec.Cmd
	if exec.Command("git", "-C", root, "rev-parse", "--git-dir").Run() == nil {
		cmd = exec.Command("git", "clone", "--quiet", "--no-hardlinks", root, dst)
	} else {
		cmd = exec.Command("cp", "-R", root, dst)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%v\n%s", cmd.Args, out)
	return dst
}
