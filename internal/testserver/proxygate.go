package testserver

import "sync"

// gate lets a Proxy's bytes through while it is open. Cut closes it and
// Heal opens it again; the pumps wait at the gate with what they hold.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

// cut closes the gate; it is a no-op when the gate is already closed.
func (g *gate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// heal opens the gate, releasing every waiter; it is a no-op when the gate
// is already open.
func (g *gate) heal() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// wait returns true once the gate is open, or false if stop is closed
// first.
func (g *gate) wait(stop <-chan struct{}) bool {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return true
	case <-stop:
		return false
	}
}
