package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The delay proxy runs in a child process of its own, so that its buffers
// and goroutines stay out of the heap and the scheduler of the process
// being measured (the memory scenario samples this process' heap). It
// still shares the machine's cores, as the server does.

// proxyEnv names the environment variable that makes this program a delay
// proxy: "target,delay", e.g. "127.0.0.1:6379,1ms".
const proxyEnv = "VALKEYSTREAM_BENCH_PROXY"

// proxySpec returns the target and delay this process is to proxy, if it is
// a proxy child.
func proxySpec() (target string, delay time.Duration, ok bool, err error) {
	v, ok := os.LookupEnv(proxyEnv)
	if !ok {
		return "", 0, false, nil
	}
	target, d, found := strings.Cut(v, ",")
	if !found {
		return "", 0, true, fmt.Errorf("proxy child: %s=%q is not target,delay", proxyEnv, v)
	}
	delay, err = time.ParseDuration(d)
	if err != nil {
		return "", 0, true, fmt.Errorf("proxy child: %s: %w", proxyEnv, err)
	}
	return target, delay, true, nil
}

// runProxyChild runs a delay proxy, writes its address on a line of
// standard output, and serves until standard input ends (the parent closed
// it, or exited).
func runProxyChild(target string, delay time.Duration) error {
	p, err := startDelayProxy(target, delay)
	if err != nil {
		return err
	}
	fmt.Println(p.addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return p.Close()
}

// proxyProcess is a delay proxy running in a child process.
type proxyProcess struct {
	addr  string
	cmd   *exec.Cmd
	stdin io.Closer
}

// startProxyProcess starts this program as a delay proxy in front of
// target and returns once it listens.
func startProxyProcess(ctx context.Context, target string, delay time.Duration) (*proxyProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to start the delay proxy: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s", proxyEnv, target, delay))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = serverProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the delay proxy: %w", err)
	}
	p := &proxyProcess{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case p.addr = <-line:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	if p.addr == "" {
		p.stop()
		return nil, fmt.Errorf("the delay proxy did not report its address")
	}
	return p, nil
}

// stop ends the proxy process and waits for it.
func (p *proxyProcess) stop() {
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}
