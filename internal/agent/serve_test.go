package agent_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/client"
)

// flakyListener fails its first Accepts with err, then hands out the
// server ends of conns.
type flakyListener struct {
	fails int
	err   error
	conns chan net.Conn
	done  chan struct{}
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, l.err
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *flakyListener) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}

func (l *flakyListener) Addr() net.Addr { return &net.UnixAddr{Name: "flaky", Net: "unix"} }

// TestServeOutlivesAcceptErrors: an accept error that is not the
// listener's close (here EMFILE, twice) does not end Serve: the next
// caller is answered.
func TestServeOutlivesAcceptErrors(t *testing.T) {
	l := &flakyListener{fails: 2, err: &net.OpError{Op: "accept", Net: "unix", Err: syscall.EMFILE}, conns: make(chan net.Conn, 1), done: make(chan struct{})}
	srv := &agent.Server{Nonce: "n-1", Reaper: &agent.Reaper{}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	c := &client.Client{Dial: func(context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		l.conns <- b
		return a, nil
	}}
	nonce, err := c.Ready(ctx)
	if err != nil || nonce != "n-1" {
		select {
		case err := <-served:
			t.Fatalf("Serve returned %v after accept errors", err)
		default:
		}
		t.Fatalf("Ready = %q, %v; want n-1", nonce, err)
	}
	l.Close()
	if err := <-served; err == nil {
		t.Errorf("Serve after the listener closed = nil, want its error")
	}
}
