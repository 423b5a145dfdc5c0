package agent_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
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

// TestReadyWaitsForTheWorkloadStart: a ready call that comes while the
// workload is starting is answered only once the start is decided: the
// nonce when it succeeded, not_started naming the error when it failed
// (and the agent's Drain waits for that answer to go out).
func TestReadyWaitsForTheWorkloadStart(t *testing.T) {
	for _, startErr := range []error{nil, errors.New("start workload /nonexistent: no such file")} {
		l := &flakyListener{conns: make(chan net.Conn, 1), done: make(chan struct{})}
		started := make(chan struct{})
		srv := &agent.Server{Nonce: "n-1", Reaper: &agent.Reaper{}, Started: func(ctx context.Context) error {
			select {
			case <-started:
				return startErr
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go srv.Serve(ctx, l)
		c := &client.Client{Dial: func(context.Context) (net.Conn, error) {
			a, b := net.Pipe()
			l.conns <- b
			return a, nil
		}}
		type answer struct {
			nonce string
			err   error
		}
		got := make(chan answer, 1)
		go func() { n, err := c.Ready(ctx); got <- answer{n, err} }()
		select {
		case a := <-got:
			t.Fatalf("ready answered %q, %v before the workload's start was decided", a.nonce, a.err)
		case <-time.After(100 * time.Millisecond):
		}
		close(started)
		srv.Drain(5 * time.Second)
		a := <-got
		var we *wire.Error
		switch {
		case startErr == nil && (a.err != nil || a.nonce != "n-1"):
			t.Errorf("ready after a started workload = %q, %v; want n-1", a.nonce, a.err)
		case startErr != nil && (!errors.As(a.err, &we) || we.Code != wire.CodeNotStarted || !strings.Contains(we.Message, "/nonexistent")):
			t.Errorf("ready after a failed start = %q, %v; want %s naming the workload", a.nonce, a.err, wire.CodeNotStarted)
		}
		l.Close()
		cancel()
	}
}
