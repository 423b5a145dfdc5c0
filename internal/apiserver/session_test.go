package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// tagged records writes of two streams in the order they came.
type tagged struct {
	mu  sync.Mutex
	log []string
}

func (t *tagged) writer(tag string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.log = append(t.log, tag+":"+string(p))
		return len(p), nil
	})
}

func (t *tagged) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.log, " ")
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestSessionStreamsStdinAndOutputInOrder: stdout and stderr arrive in the
// order the command wrote them, stdin reaches it as it is sent, and the
// exit (code, signal, timeout) comes back whole.
func TestSessionStreamsStdinAndOutputInOrder(t *testing.T) {
	fake := &fakeService{}
	fake.session = func(ctx context.Context, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
		s.Stdout.Write([]byte("o1"))
		s.Stderr.Write([]byte("e1"))
		s.Stdout.Write([]byte("o2"))
		in, err := io.ReadAll(s.Stdin)
		if err != nil {
			return api.ExecExit{}, err
		}
		s.Stdout.Write(bytes.ToUpper(in))
		return api.ExecExit{ExitCode: 3, TimedOut: true}, nil
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	var out tagged
	x, err := (&api.Client{SocketPath: srv.sock}).Session(context.Background(), "sb-1",
		api.ExecRequest{Args: []string{"cat"}}, api.Streams{Stdin: strings.NewReader("hello"), Stdout: out.writer("out"), Stderr: out.writer("err")})
	if err != nil {
		t.Fatal(err)
	}
	if x != (api.ExecExit{ExitCode: 3, TimedOut: true}) {
		t.Errorf("exit = %+v, want code 3 timed out", x)
	}
	if got, want := out.String(), "out:o1 err:e1 out:o2 out:HELLO"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
	if got := fake.Calls(); len(got) != 1 || got[0] != `Session sb-1 ["cat"] tty=false 0x0` {
		t.Errorf("calls = %q", got)
	}
}

// TestSessionResizeAndSignal: resizes and signals reach the command while
// it runs, in the order sent, and a death by signal is reported as such.
func TestSessionResizeAndSignal(t *testing.T) {
	fake := &fakeService{}
	var seen []string
	fake.session = func(ctx context.Context, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
		seen = append(seen, fmt.Sprintf("start %dx%d", req.Rows, req.Cols))
		s.Stdout.Write([]byte("$ "))
		for {
			select {
			case sz := <-s.Resize:
				seen = append(seen, fmt.Sprintf("resize %dx%d", sz.Rows, sz.Cols))
			case sig := <-s.Signal:
				seen = append(seen, fmt.Sprintf("signal %d", sig))
				return api.ExecExit{ExitCode: -1, Signal: sig}, nil
			case <-ctx.Done():
				return api.ExecExit{}, ctx.Err()
			}
		}
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	resize, signals := make(chan api.TermSize, 2), make(chan int, 1)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	prompt := make(chan struct{})
	var once sync.Once
	stdout := writerFunc(func(p []byte) (int, error) { once.Do(func() { close(prompt) }); return len(p), nil })
	go func() {
		<-prompt
		resize <- api.TermSize{Rows: 50, Cols: 120}
		resize <- api.TermSize{Rows: 10, Cols: 20}
		time.Sleep(50 * time.Millisecond) // the resizes go out first
		signals <- 15
	}()
	x, err := (&api.Client{SocketPath: srv.sock}).Session(context.Background(), "sb-1",
		api.ExecRequest{Args: []string{"sh"}, TTY: true, Rows: 24, Cols: 80},
		api.Streams{Stdin: stdinR, Stdout: stdout, Resize: resize, Signal: signals})
	if err != nil {
		t.Fatal(err)
	}
	if x != (api.ExecExit{ExitCode: -1, Signal: 15}) {
		t.Errorf("exit = %+v, want killed by 15", x)
	}
	if got, want := strings.Join(seen, ", "), "start 24x80, resize 50x120, resize 10x20, signal 15"; got != want {
		t.Errorf("the command saw %q, want %q", got, want)
	}
}

// TestSessionCallerGoneCancels: a caller that goes away mid-command ends
// the Service's context (so the node kills the process group) and frees
// the exec slot.
func TestSessionCallerGoneCancels(t *testing.T) {
	fake := &fakeService{}
	cancelled := make(chan error, 1)
	fake.session = func(ctx context.Context, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
		s.Stdout.Write([]byte("started"))
		<-ctx.Done()
		cancelled <- context.Cause(ctx)
		return api.ExecExit{}, ctx.Err()
	}
	execs := NewLimiter("execs", "--max-concurrent-execs", 1, time.Second)
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, Execs: execs})
	for _, stdinOpen := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		var once sync.Once
		stdout := writerFunc(func(p []byte) (int, error) { once.Do(func() { close(started) }); return len(p), nil })
		var stdin io.Reader // nil: stdin closed at once, the body ends cleanly later
		if stdinOpen {
			r, w := io.Pipe()
			defer w.Close()
			stdin = r
		}
		go func() { <-started; cancel() }()
		_, err := (&api.Client{SocketPath: srv.sock}).Session(ctx, "sb-1", api.ExecRequest{Args: []string{"sleep", "inf"}}, api.Streams{Stdin: stdin, Stdout: stdout})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("stdin open %v: session after cancel: %v, want context canceled", stdinOpen, err)
		}
		select {
		case cause := <-cancelled:
			t.Logf("stdin open %v: the Service's context ended: %v", stdinOpen, cause)
		case <-time.After(5 * time.Second):
			t.Fatalf("stdin open %v: the Service's context did not end 5s after the caller went away", stdinOpen)
		}
		for deadline := time.Now().Add(5 * time.Second); execs.InUse() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the exec slot was not returned")
			}
		}
	}
}

// sessionBody builds a session request body from frames.
func sessionBody(frames ...any) []byte {
	var b bytes.Buffer
	for i := 0; i < len(frames); i += 2 {
		p, ok := frames[i+1].([]byte)
		if !ok {
			p, _ = json.Marshal(frames[i+1])
		}
		api.WriteFrame(&b, frames[i].(api.FrameType), p)
	}
	return b.Bytes()
}

// TestSessionBadInputNeverReachesService: a session request that is not a
// valid first frame gets a clear error, takes no exec slot and never
// reaches the Service.
func TestSessionBadInputNeverReachesService(t *testing.T) {
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, MaxBodyBytes: 1024})
	ct := map[string]string{"Content-Type": api.ContentTypeSession}
	cat := api.ExecRequest{Args: []string{"cat"}}
	cases := []struct {
		name   string
		header map[string]string
		body   []byte
		status int
		msg    string
	}{
		{"json content type", map[string]string{"Content-Type": "application/json"}, []byte(`{"args":["cat"]}`), 415, "a session sends"},
		{"empty body", ct, nil, 400, "session body is empty"},
		{"stdin first", ct, sessionBody(api.FrameStdin, []byte("x")), 400, "starts with a 'i' frame"},
		{"truncated header", ct, []byte{'Q', 0, 0}, 400, "read session request frame"},
		{"truncated payload", ct, []byte{'Q', 0, 0, 0, 9, '{'}, 400, "read session request frame"},
		{"request over body cap", ct, sessionBody(api.FrameRequest, []byte(`{"args":["`+strings.Repeat("a", 2000)+`"]}`)), 400, "exceeds 1024 bytes"},
		{"bad json", ct, sessionBody(api.FrameRequest, []byte(`{"args":`)), 400, "truncated JSON"},
		{"unknown field", ct, sessionBody(api.FrameRequest, []byte(`{"args":["cat"],"shell":true}`)), 400, `unknown field "shell"`},
		{"trailing data", ct, sessionBody(api.FrameRequest, []byte(`{"args":["cat"]} {}`)), 400, "data after"},
		{"no args", ct, sessionBody(api.FrameRequest, api.ExecRequest{}), 400, "args"},
		{"stdin in request", ct, sessionBody(api.FrameRequest, api.ExecRequest{Args: []string{"cat"}, Stdin: []byte("x")}), 400, "stdin frames"},
		{"rows without tty", ct, sessionBody(api.FrameRequest, api.ExecRequest{Args: []string{"cat"}, Rows: 5}), 400, "need tty"},
		{"bad user", ct, sessionBody(api.FrameRequest, api.ExecRequest{Args: []string{"cat"}, User: &api.User{UID: ^uint32(0)}}), 400, "not a user"},
		{"bad id", ct, sessionBody(api.FrameRequest, cat), 400, "invalid sandbox id"},
	}
	for _, c := range cases {
		target := "/v1/sandboxes/sb-1/session"
		if c.name == "bad id" {
			target = "/v1/sandboxes/..%2Fx/session"
		}
		resp := rawDo(t, srv.sock, "POST", target, c.header, c.body)
		var eb api.ErrorBody
		if err := json.Unmarshal(resp.body, &eb); err != nil || resp.status != c.status || eb.Code != errdefs.CodeInvalidArgument || !strings.Contains(eb.Message, c.msg) {
			t.Errorf("%s: %d %s, want %d invalid_argument containing %q", c.name, resp.status, resp.body, c.status, c.msg)
		}
	}
	if calls := fake.Calls(); len(calls) != 0 {
		t.Errorf("the Service saw %q", calls)
	}
}

// TestSessionBrokenStreamKillsCommand: a bad frame once the command runs
// ends its context and the caller gets an error frame saying why.
func TestSessionBrokenStreamKillsCommand(t *testing.T) {
	cat := api.ExecRequest{Args: []string{"cat"}}
	cases := []struct {
		name string
		body []byte
		msg  string
	}{
		{"unknown frame", sessionBody(api.FrameRequest, cat, api.FrameType('?'), []byte("x")), `unknown frame type '?'`},
		{"second request", sessionBody(api.FrameRequest, cat, api.FrameRequest, cat), `unknown frame type 'Q'`},
		{"bad resize", sessionBody(api.FrameRequest, cat, api.FrameResize, []byte(`{"rows":"x"}`)), "resize frame"},
		{"zero resize", sessionBody(api.FrameRequest, cat, api.FrameResize, api.TermSize{}), "rows and cols must be at least 1"},
		{"signal 0", sessionBody(api.FrameRequest, cat, api.FrameSignal, api.SessionSignal{}), "signal 0"},
		{"signal 99", sessionBody(api.FrameRequest, cat, api.FrameSignal, api.SessionSignal{Signal: 99}), "signal 99"},
		{"stdin after close", sessionBody(api.FrameRequest, cat, api.FrameStdinClose, []byte{}, api.FrameStdin, []byte("x")), "stdin frame after stdin was closed"},
		{"oversized frame", append(sessionBody(api.FrameRequest, cat), 'i', 0, 2, 0, 0), "over 65536"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fake := &fakeService{}
			fake.session = func(ctx context.Context, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
				s.Stdout.Write([]byte("running"))
				<-ctx.Done()
				return api.ExecExit{}, ctx.Err()
			}
			srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
			resp := rawDo(t, srv.sock, "POST", "/v1/sandboxes/sb-1/session", map[string]string{"Content-Type": api.ContentTypeSession}, c.body)
			var out tagged
			_, err := readSessionForTest(resp.body, &out)
			if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("%d, output %q, err %v: want invalid_argument containing %q", resp.status, out.String(), err, c.msg)
			}
		})
	}
}

func readSessionForTest(b []byte, out *tagged) (api.ExecExit, error) {
	r := bytes.NewReader(b)
	for {
		ty, p, err := api.ReadFrame(r, api.MaxFramePayload)
		if err != nil {
			return api.ExecExit{}, err
		}
		switch ty {
		case api.FrameStdout, api.FrameStderr:
			out.writer(string(ty)).Write(p)
		case api.FrameExit:
			var x api.ExecExit
			return x, json.Unmarshal(p, &x)
		case api.FrameError:
			var eb api.ErrorBody
			json.Unmarshal(p, &eb)
			return api.ExecExit{}, &errdefs.Error{Code: eb.Code, Message: eb.Message}
		}
	}
}

// TestSessionHalfDuplexCaller: a caller that sends its whole body (request,
// stdin, end) before reading still gets the command's output and exit.
func TestSessionHalfDuplexCaller(t *testing.T) {
	fake := &fakeService{}
	fake.session = func(ctx context.Context, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
		in, _ := io.ReadAll(s.Stdin)
		s.Stdout.Write(in)
		return api.ExecExit{ExitCode: 0}, nil
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	body := sessionBody(api.FrameRequest, api.ExecRequest{Args: []string{"cat"}}, api.FrameStdin, []byte("one "), api.FrameStdin, []byte("two"))
	resp := rawDo(t, srv.sock, "POST", "/v1/sandboxes/sb-1/session", map[string]string{"Content-Type": api.ContentTypeSession}, body)
	var out tagged
	x, err := readSessionForTest(resp.body, &out)
	if err != nil || x.ExitCode != 0 || out.String() != "o:one two" {
		t.Errorf("%d: %q %+v %v", resp.status, out.String(), x, err)
	}
}

// TestSessionErrorBeforeOutputIsPlain: a Service error before any output
// is a JSON error with its status, as for the other routes.
func TestSessionErrorBeforeOutputIsPlain(t *testing.T) {
	fake := &fakeService{err: errdefs.Errorf(errdefs.CodeNotFound, "sandbox sb-1 not found")}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	start := time.Now()
	_, err := (&api.Client{SocketPath: srv.sock}).Session(context.Background(), "sb-1", api.ExecRequest{Args: []string{"true"}}, api.Streams{})
	if errdefs.CodeOf(err) != errdefs.CodeNotFound || !strings.Contains(err.Error(), "sb-1 not found") {
		t.Errorf("session of a missing sandbox: %v", err)
	}
	// The error is whole once sent: the caller need not end its body (nor
	// wait for the server's linger) to read it.
	if d := time.Since(start); d > sessionLinger/2 {
		t.Errorf("the error took %v to arrive", d)
	}
}

// TestSessionBusy: sessions share the exec limiter.
func TestSessionBusy(t *testing.T) {
	fake := &fakeService{}
	execs := NewLimiter("execs", "--max-concurrent-execs", 1, time.Second)
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, Execs: execs})
	release, err := execs.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	_, err = (&api.Client{SocketPath: srv.sock}).Session(context.Background(), "sb-1", api.ExecRequest{Args: []string{"true"}}, api.Streams{})
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || errdefs.RetryAfterOf(err) <= 0 {
		t.Errorf("session beyond the exec limit: %v, want unavailable with a retry hint", err)
	}
	if calls := fake.Calls(); len(calls) != 0 {
		t.Errorf("the Service saw %q", calls)
	}
}
