package bounded

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
)

// closer counts its Closes.
type closer struct{ closes atomic.Int32 }

func (c *closer) Close() error {
	c.closes.Add(1)
	return nil
}

func TestAConnIsClosedByTheLastCallRunningOnIt(t *testing.T) {
	c := &closer{}
	conn := NewConn(c, false)
	inCall, release := make(chan struct{}), make(chan struct{})
	done := make(chan bool)
	go func() {
		done <- conn.Use(func(*closer) {
			close(inCall)
			<-release
		})
	}()
	<-inCall
	conn.Close()
	assert.Zero(t, c.closes.Load(), "closed while a call ran on it")
	assert.False(t, conn.Use(func(*closer) { t.Error("a call ran after Close") }))
	close(release)
	assert.True(t, <-done)
	assert.Equal(t, int32(1), c.closes.Load(), "the last call closes it")
	conn.Close()
	assert.Equal(t, int32(1), c.closes.Load(), "closed once")
}

func TestAConnIdleOrCloseAtOnceIsClosedAtOnce(t *testing.T) {
	idle := &closer{}
	NewConn(idle, false).Close()
	assert.Equal(t, int32(1), idle.closes.Load())

	own := &closer{}
	conn := NewConn(own, true)
	inCall, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn.Use(func(*closer) {
			close(inCall)
			<-release
		})
	}()
	<-inCall
	conn.Close()
	assert.Equal(t, int32(1), own.closes.Load(), "a connection closed at once does not wait for its calls")
	close(release)
	<-done
	assert.Equal(t, int32(1), own.closes.Load(), "closed once")
}
