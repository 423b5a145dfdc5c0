package apiserver

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

func TestLogsQueryRefusedBeforeTheService(t *testing.T) {
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	for _, target := range []string{
		"/v1/sandboxes/sb-1/logs?source=kernel",
		"/v1/sandboxes/sb-1/logs?tail=x",
		"/v1/sandboxes/sb-1/logs?tail=1&tail=2",
		"/v1/sandboxes/sb-1/logs?idle_sec=99999",
		"/v1/sandboxes/sb-1/logs?since=1",
		"/v1/sandboxes/..%2f/logs",
	} {
		r := rawDo(t, srv.sock, http.MethodGet, target, nil, nil)
		if r.status != http.StatusBadRequest || !bytes.Contains(r.body, []byte(`"invalid_argument"`)) {
			t.Errorf("GET %s: %d %s, want 400 invalid_argument", target, r.status, r.body)
		}
	}
	if calls := fake.Calls(); len(calls) != 0 {
		t.Fatalf("service saw %q", calls)
	}
}

func TestClientLogs(t *testing.T) {
	fake := &fakeService{logs: func(ctx context.Context, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
		w.Write([]byte("one\ntwo\n"))
		if !req.Follow {
			return api.LogsEnd{Reason: "end of log"}, nil
		}
		for i := 0; i < 3; i++ {
			time.Sleep(10 * time.Millisecond)
			w.Write([]byte("more\n"))
		}
		return api.LogsEnd{Generation: 2, Reason: "generation 2 ended: released"}, nil
	}}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	c := &api.Client{SocketPath: srv.sock}
	ctx := context.Background()
	var out bytes.Buffer
	end, err := c.Logs(ctx, "sb-1", api.LogsRequest{Tail: 5, Source: api.LogSourceRunsc}, &out)
	if err != nil || out.String() != "one\ntwo\n" || end.Reason != "end of log" {
		t.Fatalf("logs: %q %+v %v", out.String(), end, err)
	}
	out.Reset()
	end, err = c.Logs(ctx, "sb-1", api.LogsRequest{Follow: true, IdleSec: 7}, &out)
	if err != nil || out.String() != "one\ntwo\nmore\nmore\nmore\n" || end != (api.LogsEnd{Generation: 2, Reason: "generation 2 ended: released"}) {
		t.Fatalf("follow: %q %+v %v", out.String(), end, err)
	}
	want := []string{"Logs sb-1 source=runsc tail=5 follow=false idle=300", "Logs sb-1 source=init tail=0 follow=true idle=7"}
	if got := fake.Calls(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("calls %q, want %q", got, want)
	}

	// An error before any output keeps its status; after output it is the
	// stream's last event.
	fake.logs = func(ctx context.Context, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
		return api.LogsEnd{}, errdefs.Errorf(errdefs.CodeNotFound, "logs of sandbox sb-1 generation 2 were removed at its release")
	}
	if _, err := c.Logs(ctx, "sb-1", api.LogsRequest{Follow: true}, &out); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("follow of removed logs: %v, want not_found", err)
	}
	fake.logs = func(ctx context.Context, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
		w.Write([]byte("x"))
		return api.LogsEnd{}, errdefs.Errorf(errdefs.CodeInternal, "read log: boom")
	}
	out.Reset()
	if _, err := c.Logs(ctx, "sb-1", api.LogsRequest{Follow: true}, &out); errdefs.CodeOf(err) != errdefs.CodeInternal || out.String() != "x" {
		t.Fatalf("follow failing midway: %q, %v", out.String(), err)
	}
}

// TestLogFollowEndsAtShutdown: a follow has no end of its own, so a
// graceful shutdown (the primary handing over) must end it rather than wait
// out its grace.
func TestLogFollowEndsAtShutdown(t *testing.T) {
	started := make(chan struct{})
	fake := &fakeService{logs: func(ctx context.Context, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
		w.Write([]byte("hello\n"))
		close(started)
		select {
		case <-api.ShuttingDown(ctx):
			return api.LogsEnd{Reason: "node shutting down"}, nil
		case <-ctx.Done():
			return api.LogsEnd{}, ctx.Err()
		}
	}}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, ShutdownGrace: 20 * time.Second})
	c := &api.Client{SocketPath: srv.sock}
	type result struct {
		end api.LogsEnd
		err error
	}
	res := make(chan result, 1)
	var out bytes.Buffer
	go func() {
		end, err := c.Logs(context.Background(), "sb-1", api.LogsRequest{Follow: true}, &out)
		res <- result{end, err}
	}()
	<-started
	t0 := time.Now()
	if err := srv.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("shutdown took %v with a follow open; want it ended at once", d)
	}
	r := <-res
	if r.err != nil || r.end.Reason != "node shutting down" || out.String() != "hello\n" {
		t.Fatalf("follow across shutdown: %q %+v %v", out.String(), r.end, r.err)
	}
}

func TestLogsAnswerKeepsTheLatestBytes(t *testing.T) {
	fake := &fakeService{logs: func(ctx context.Context, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
		w.Write([]byte("old old old\n"))
		w.Write([]byte("newest\n"))
		return api.LogsEnd{Reason: "end of log"}, nil
	}}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, MaxFileBytes: 10})
	var out bytes.Buffer
	if _, err := (&api.Client{SocketPath: srv.sock}).Logs(context.Background(), "sb-1", api.LogsRequest{}, &out); err != nil || out.String() != "ld\nnewest\n" {
		t.Fatalf("logs over MaxFileBytes: %q, %v; want its last 10 bytes", out.String(), err)
	}
}
