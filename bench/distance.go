package main

import (
	"context"
	"fmt"
	"time"
)

// A distance is where the clients of a pass of the benchmark are: on
// loopback (no added delay) or behind a delay proxy.
type distance struct {
	delay time.Duration // added to the server's replies; 0 for plain loopback
	rtt   time.Duration // round trip measured from the clients' side
	addr  string        // where the clients connect
	proxy *proxyProcess // nil on plain loopback
}

// openDistance starts a delay proxy in front of the server, in a child
// process (none for a zero delay), and measures the round trip through it.
func (b *bench) openDistance(ctx context.Context, delay time.Duration) (distance, error) {
	d := distance{delay: delay, addr: b.srv.addr}
	if delay > 0 {
		p, err := startProxyProcess(ctx, b.srv.addr, delay)
		if err != nil {
			return distance{}, err
		}
		d.proxy, d.addr = p, p.addr
	}
	rtt, err := measureRTT(ctx, d.addr)
	if err != nil {
		d.close()
		return distance{}, err
	}
	d.rtt = rtt
	return d, nil
}

// close stops the delay proxy, if any.
func (d distance) close() {
	if d.proxy != nil {
		d.proxy.stop()
	}
}

// describe names the distance for the progress output.
func (d distance) describe() string {
	if d.delay == 0 {
		return "loopback, round trip " + formatDuration(d.rtt)
	}
	return fmt.Sprintf("replies delayed %s, round trip %s", d.delay, formatDuration(d.rtt))
}

// atDistances runs pass once at each configured delay, with b.dist set.
func (b *bench) atDistances(ctx context.Context, pass func(d distance) error) error {
	for _, delay := range b.cfg.delays {
		d, err := b.openDistance(ctx, delay)
		if err != nil {
			return fmt.Errorf("delay %s: %w", delay, err)
		}
		b.dist = d
		fmt.Fprintf(b.progress, "distance: %s\n", d.describe())
		err = pass(d)
		d.close()
		b.dist = distance{addr: b.srv.addr}
		if err != nil {
			return err
		}
	}
	return nil
}
