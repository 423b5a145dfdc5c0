package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// sessionLinger is how long a session's caller has, after the last frame,
// to end its request body before the connection is cut.
const sessionLinger = 5 * time.Second

// sessionStdinQueue is how many stdin frames wait for the command before
// the reader stops reading (so control frames behind them wait too).
const sessionStdinQueue = 16

var (
	errCallerGone = errors.New("session caller gone")
	errSessionEnd = errors.New("session ended")
)

// handleSession serves POST /v1/sandboxes/{id}/session: an exec whose
// request body (stdin, resizes, signals) and response body (stdout,
// stderr, exit) are both frame streams at once. HTTP/1.1 full duplex
// (http.ResponseController.EnableFullDuplex) carries it: it is an ordinary
// request to the peer check, the limiter, the log and a graceful shutdown,
// and needs no library; see docs/architecture.md "API".
func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != api.ContentTypeSession {
		return &statusError{http.StatusUnsupportedMediaType,
			invalid("content-type %s not supported: a session sends %s frames", errdefs.Quote(r.Header.Get("Content-Type")), api.ContentTypeSession)}
	}
	body := bufio.NewReaderSize(r.Body, 64<<10)
	req, err := s.sessionRequest(body)
	if err != nil {
		return err
	}
	release, err := acquireBoth(s.SandboxExecs, id, s.Execs)
	if err != nil {
		return err
	}
	defer release()
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		return fmt.Errorf("session: enable full duplex: %w", err)
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	in := &sessionInput{
		stdin:   make(chan []byte, sessionStdinQueue),
		resize:  make(chan api.TermSize, 16),
		signals: make(chan int, 16),
	}
	stdinR, stdinW := io.Pipe()
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		in.read(ctx, body, cancel)
	}()
	go in.feed(stdinW)
	out := &frameOut{w: w, rc: rc, gone: func() { cancel(errCallerGone) }}
	x, err := s.Service.Session(ctx, id, req, api.Streams{
		Stdin: stdinR, Stdout: out.stream(api.FrameStdout), Stderr: out.stream(api.FrameStderr),
		Resize: in.resize, Signal: in.signals,
	})
	release()
	stdinR.CloseWithError(errSessionEnd)
	var pe *protocolError
	if errors.As(context.Cause(ctx), &pe) {
		// The caller broke the stream: that is why the command ended.
		err = pe.err
	}
	if err != nil && !out.hasStarted() {
		answerError(w, err)
	} else if err != nil {
		c := errdefs.CodeOf(err)
		if rec, ok := w.(*recorder); ok {
			rec.code = c
		}
		b, _ := json.Marshal(api.ErrorBody{Code: c, Message: wireMessage(err), RetryAfterSec: retryAfterSec(errdefs.RetryAfterOf(err))})
		_ = out.frame(api.FrameError, b) // the caller may be gone; the log has it
	} else {
		b, _ := json.Marshal(x)
		_ = out.frame(api.FrameExit, b)
	}
	// The caller ends its body once it read the last frame; one that does
	// not is cut, so the reader (and the connection) cannot be held.
	_ = rc.Flush()
	_ = rc.SetReadDeadline(time.Now().Add(sessionLinger))
	cancel(errSessionEnd)
	<-readerDone
	return nil
}

// sessionRequest reads and checks the first frame: nothing reaches the
// Service (or takes an exec slot) unless it is a valid request.
func (s *Server) sessionRequest(body io.Reader) (api.ExecRequest, error) {
	var req api.ExecRequest
	t, p, err := api.ReadFrame(body, int(s.maxBody()))
	switch {
	case errors.Is(err, api.ErrFrame):
		return req, invalid("session request frame exceeds %d bytes", s.maxBody())
	case errors.Is(err, io.EOF):
		return req, invalid("session body is empty: want a request frame")
	case err != nil:
		return req, invalid("read session request frame: %v", err)
	case t != api.FrameRequest:
		return req, invalid("session starts with a %q frame: want the request frame %q", byte(t), byte(api.FrameRequest))
	}
	if err := api.DecodeStrict(p, &req); err != nil {
		return req, bodyError(err, s.maxBody())
	}
	return req, req.ValidateSession()
}

// protocolError is a caller's broken frame stream: the command is killed
// and the caller told why (invalid_argument).
type protocolError struct{ err *errdefs.Error }

func (e *protocolError) Error() string { return e.err.Error() }

// sessionInput moves the caller's frames to the Service's streams.
type sessionInput struct {
	stdin   chan []byte
	resize  chan api.TermSize
	signals chan int
}

// read reads frames until the body ends, the stream breaks or ctx ends. A
// clean end of the body closes stdin and leaves the command running (a
// caller may send everything, then only read); a broken one is a caller
// gone, which kills the command.
func (in *sessionInput) read(ctx context.Context, body io.Reader, cancel context.CancelCauseFunc) {
	stdinOpen := true
	closeStdin := func() {
		if stdinOpen {
			stdinOpen = false
			close(in.stdin)
		}
	}
	defer closeStdin()
	bad := func(format string, args ...any) {
		cancel(&protocolError{invalid("session: "+format, args...)})
	}
	for {
		t, p, err := api.ReadFrame(body, api.MaxFramePayload)
		switch {
		case errors.Is(err, io.EOF):
			return
		case errors.Is(err, api.ErrFrame):
			bad("%v", err)
			return
		case err != nil:
			if ctx.Err() == nil {
				cancel(fmt.Errorf("%w: %v", errCallerGone, err))
			}
			return
		}
		var send func() bool
		switch t {
		case api.FrameStdin:
			if !stdinOpen {
				bad("stdin frame after stdin was closed")
				return
			}
			send = func() bool { return put(ctx, in.stdin, p) }
		case api.FrameStdinClose:
			closeStdin()
			continue
		case api.FrameResize:
			var sz api.TermSize
			if err := api.DecodeStrict(p, &sz); err != nil {
				bad("resize frame: %v", err)
				return
			}
			if err := sz.Validate(); err != nil {
				cancel(&protocolError{err.(*errdefs.Error)})
				return
			}
			send = func() bool { return put(ctx, in.resize, sz) }
		case api.FrameSignal:
			var sig api.SessionSignal
			if err := api.DecodeStrict(p, &sig); err != nil {
				bad("signal frame: %v", err)
				return
			}
			if err := sig.Validate(); err != nil {
				cancel(&protocolError{err.(*errdefs.Error)})
				return
			}
			send = func() bool { return put(ctx, in.signals, sig.Signal) }
		default:
			bad("unknown frame type %q", byte(t))
			return
		}
		if !send() {
			return
		}
	}
}

// feed writes the stdin frames to the Service's stdin pipe; the pipe ends
// when stdin is closed (or the reader gave up).
func (in *sessionInput) feed(w *io.PipeWriter) {
	for p := range in.stdin {
		if _, err := w.Write(p); err != nil {
			// The command ended: drain so the reader never blocks.
			for range in.stdin {
			}
			return
		}
	}
	w.Close()
}

func put[T any](ctx context.Context, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-ctx.Done():
		return false
	}
}

// frameOut writes frames to the response. The Service may write stdout and
// stderr from two goroutines, so frames are serialized. The header goes out
// with the first frame, so an error before any output is still a plain
// JSON error with its status.
type frameOut struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	gone    func() // the caller is gone (a write failed)
	started bool
	err     error
}

func (f *frameOut) frame(t api.FrameType, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if !f.started {
		f.started = true
		h := f.w.Header()
		h.Set("Content-Type", api.ContentTypeSession)
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		f.w.WriteHeader(http.StatusOK)
	}
	if err := api.WriteFrame(f.w, t, p); err != nil {
		f.err = err
	} else if err := f.rc.Flush(); err != nil {
		f.err = fmt.Errorf("flush %c frame: %w", t, err)
	}
	if f.err != nil {
		f.gone()
	}
	return f.err
}

func (f *frameOut) hasStarted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

// stream returns a writer that sends what is written to it as frames of
// type t, at most api.MaxFramePayload each.
func (f *frameOut) stream(t api.FrameType) io.Writer {
	return frameStream{f: f, t: t}
}

type frameStream struct {
	f *frameOut
	t api.FrameType
}

func (o frameStream) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), api.MaxFramePayload)]
		if err := o.f.frame(o.t, c); err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}
