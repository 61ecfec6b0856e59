package delay

import "sync"

// local is the Movers of this process by the stream keys they move, so
// that a Publisher of the process that stores a delayed message wakes them
// at once (Notify) instead of leaving them to find it on an idle beat.
var local = registry{movers: map[string]map[*Mover]int{}}

// registry is the Movers of a process by stream key, each with how many
// times it registered the key.
type registry struct {
	mu     sync.Mutex
	movers map[string]map[*Mover]int
}

func (r *registry) add(key string, m *Mover) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.movers[key] == nil {
		r.movers[key] = map[*Mover]int{}
	}
	r.movers[key][m]++
}

func (r *registry) remove(key string, m *Mover) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.movers[key][m]--; r.movers[key][m] <= 0 {
		delete(r.movers[key], m)
	}
	if len(r.movers[key]) == 0 {
		delete(r.movers, key)
	}
}

// Notify tells every Mover of this process that moves the stream key that
// a delayed message was stored for it: its next round runs within its
// Every, and it finds the sorted set and keeps that beat while the set
// exists. It costs no call to the server.
func Notify(key string) {
	local.mu.Lock()
	defer local.mu.Unlock()
	for m := range local.movers[key] {
		m.signal()
	}
}
