package testserver

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// link is one client connection through a Proxy and, once dialed, its
// connection to the target. Its methods are safe for concurrent use.
type link struct {
	client *net.TCPConn
	done   chan struct{} // closed when the link ends

	mu     sync.Mutex
	server *net.TCPConn // nil until dialed
	ended  bool
}

func newLink(client *net.TCPConn) *link {
	return &link{client: client, done: make(chan struct{})}
}

// attach sets the connection to the target. It reports false, and closes
// server, when the link has already ended (reset while dialing).
func (l *link) attach(server *net.TCPConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		_ = server.SetLinger(0)
		_ = server.Close()
		return false
	}
	l.server = server
	return true
}

// end closes both connections, abruptly (SO_LINGER 0: the peers see a
// reset) or not, and wakes the pumps waiting at the gate. It reports
// whether this call ended the link.
func (l *link) end(abrupt bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.ended = true
	for _, c := range []*net.TCPConn{l.client, l.server} {
		if c == nil {
			continue
		}
		if abrupt {
			_ = c.SetLinger(0)
		}
		_ = c.Close()
	}
	close(l.done)
	return true
}

// pump copies src to dst, each chunk once the gate is open, and adds what
// it delivered to delivered. An end of stream is passed on as a half
// close (through the gate too); a failure on either side resets the link.
func pump(l *link, g *gate, dst, src *net.TCPConn, delivered *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !g.wait(l.done) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				l.end(true)
				return
			}
			delivered.Add(int64(n))
		}
		if errors.Is(err, io.EOF) {
			if g.wait(l.done) {
				_ = dst.CloseWrite()
			}
			return
		}
		if err != nil {
			l.end(true)
			return
		}
	}
}

// linkSet is the live links of a Proxy. Once closed it takes no more.
type linkSet struct {
	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
}

// add reports false when the set is closed.
func (s *linkSet) add(l *link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.links == nil {
		s.links = make(map[*link]struct{})
	}
	s.links[l] = struct{}{}
	return true
}

func (s *linkSet) remove(l *link) {
	s.mu.Lock()
	delete(s.links, l)
	s.mu.Unlock()
}

// reset ends every live link abruptly and returns how many it ended. With
// closing set, the set takes no more links afterwards.
func (s *linkSet) reset(closing bool) int {
	s.mu.Lock()
	if closing {
		s.closed = true
	}
	links := make([]*link, 0, len(s.links))
	for l := range s.links {
		links = append(links, l)
	}
	s.mu.Unlock()
	n := 0
	for _, l := range links {
		if l.end(true) {
			n++
		}
	}
	return n
}
