package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// A session (POST /v1/sandboxes/{id}/session, Content-Type
// ContentTypeSession) is an exec with streamed stdin, an optional PTY,
// resizes and signals. It is one HTTP/1.1 request whose request body and
// response body are both streams of frames, sent at the same time (full
// duplex; the server enables it per request). A frame is a type byte, a
// 4-byte big-endian payload length and the payload: the same framing as the
// guest agent's, with the same letters.
//
// Caller → ctld: FrameRequest (ExecRequest JSON, first and once), then any
// of FrameStdin, FrameStdinClose, FrameResize (TermSize JSON), FrameSignal
// (SessionSignal JSON). ctld → caller: FrameStdout, FrameStderr, then one
// last FrameExit (ExecExit JSON) or FrameError (ErrorBody JSON). An error
// found before the command starts is a plain JSON error with its status.
const (
	ContentTypeSession = "application/vnd.ctld.session"

	FrameRequest    FrameType = 'Q'
	FrameStdin      FrameType = 'i'
	FrameStdinClose FrameType = 'c'
	FrameResize     FrameType = 'z'
	FrameSignal     FrameType = 'k'
	FrameStdout     FrameType = 'o'
	FrameStderr     FrameType = 'e'
	FrameExit       FrameType = 'x'
	FrameError      FrameType = 'E'

	// MaxFramePayload bounds every frame but the request (which is
	// bounded like a JSON body).
	MaxFramePayload = 64 << 10
	// maxControl bounds a resize, signal, exit or error frame.
	maxControl = 8 << 10
	// MaxSignal is the highest signal number a session accepts.
	MaxSignal = 64
)

// FrameType is a session frame's kind.
type FrameType byte

// SessionSignal is the payload of a FrameSignal.
type SessionSignal struct {
	Signal int `json:"signal"`
}

// ErrFrame is wrapped by every framing error (oversized, truncated).
var ErrFrame = errors.New("bad session frame")

// WriteFrame writes one frame in one Write, so frames of writers sharing w
// under a lock never interleave.
func WriteFrame(w io.Writer, t FrameType, p []byte) error {
	b := make([]byte, 5, 5+len(p))
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:], uint32(len(p)))
	if _, err := w.Write(append(b, p...)); err != nil {
		return fmt.Errorf("write %c frame: %w", t, err)
	}
	return nil
}

// ReadFrame reads one frame whose payload is at most max bytes; a larger
// one is refused from its header, before its payload is read. A clean end
// before a frame is io.EOF; anything cut short is io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, max int) (FrameType, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if int64(n) > int64(max) {
		return 0, nil, fmt.Errorf("%c frame of %d bytes, over %d: %w", h[0], n, max, ErrFrame)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return FrameType(h[0]), p, nil
}

// DecodeStrict decodes exactly one JSON value of b into v, refusing
// unknown fields and trailing data.
func DecodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON value")
	}
	return nil
}

// ValidateSession checks what a session adds to Validate: stdin comes in
// frames, and a terminal's size is that of a PTY.
func (r ExecRequest) ValidateSession() error {
	if err := r.Validate(); err != nil {
		return err
	}
	if len(r.Stdin) > 0 {
		return invalid("a session's stdin comes in stdin frames, not in the request's stdin field")
	}
	if !r.TTY && (r.Rows != 0 || r.Cols != 0) {
		return invalid("rows and cols need tty")
	}
	return nil
}

// Validate checks a resize of a PTY session.
func (s TermSize) Validate() error {
	if s.Rows == 0 || s.Cols == 0 {
		return invalid("resize to %dx%d: rows and cols must be at least 1", s.Rows, s.Cols)
	}
	return nil
}

// Validate checks a signal of a session.
func (s SessionSignal) Validate() error {
	if s.Signal < 1 || s.Signal > MaxSignal {
		return invalid("signal %d: must be between 1 and %d", s.Signal, MaxSignal)
	}
	return nil
}

// frameWriter serializes frames of several goroutines onto one writer.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(t FrameType, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return WriteFrame(f.w, t, p)
}

func (f *frameWriter) json(t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %c frame: %w", t, err)
	}
	return f.frame(t, b)
}

// errSessionOver ends the request body's writers once the answer is read.
var errSessionOver = errors.New("session over")

// Session runs a command with streamed stdin, stdout and stderr (and a PTY
// when r.TTY), sending s.Resize and s.Signal as they come, and returns how
// it ended. Ending ctx (or losing the connection) kills the command's
// process group in the guest. A read of s.Stdin in progress when the
// command ends is not waited for: it is dropped with its data.
func (c *Client) Session(ctx context.Context, id string, r ExecRequest, s Streams) (ExecExit, error) {
	p, err := sandboxPath(id, "session")
	if err != nil {
		return ExecExit{}, err
	}
	if err := r.ValidateSession(); err != nil {
		return ExecExit{}, err
	}
	req, err := json.Marshal(r)
	if err != nil {
		return ExecExit{}, fmt.Errorf("encode request: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	defer pr.CloseWithError(errSessionOver)
	fw := &frameWriter{w: pw}
	go sendSession(ctx, fw, req, s)
	h := http.Header{"Accept": {ContentTypeSession}, "Content-Type": {ContentTypeSession}}
	resp, err := c.do(ctx, http.MethodPost, p, nil, pr, h)
	if err != nil {
		return ExecExit{}, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != ContentTypeSession {
		return ExecExit{}, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("session answered %q, want %s", mt, ContentTypeSession)}
	}
	x, err := readSession(resp.Body, s.Stdout, s.Stderr)
	if err != nil && ctx.Err() != nil {
		return x, fmt.Errorf("session: %w", ctx.Err())
	}
	return x, err
}

// sendSession writes the request frame, then stdin, resizes and signals
// until ctx ends (the answer was read) or the body is closed.
func sendSession(ctx context.Context, fw *frameWriter, req []byte, s Streams) {
	if err := fw.frame(FrameRequest, req); err != nil {
		return
	}
	go func() {
		if s.Stdin == nil {
			_ = fw.frame(FrameStdinClose, nil)
			return
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Stdin.Read(buf)
			if n > 0 {
				if werr := fw.frame(FrameStdin, buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				// Any end of the local stdin closes the command's.
				_ = fw.frame(FrameStdinClose, nil)
				return
			}
		}
	}()
	resize, signals := s.Resize, s.Signal
	for {
		select {
		case <-ctx.Done():
			return
		case sz, ok := <-resize:
			if !ok {
				resize = nil
				continue
			}
			if fw.json(FrameResize, sz) != nil {
				return
			}
		case sig, ok := <-signals:
			if !ok {
				signals = nil
				continue
			}
			if fw.json(FrameSignal, SessionSignal{Signal: sig}) != nil {
				return
			}
		}
	}
}

// readSession copies output frames to stdout and stderr until the exit or
// error frame. Every frame is bounded; anything else is a broken stream.
func readSession(r io.Reader, stdout, stderr io.Writer) (ExecExit, error) {
	broken := func(format string, args ...any) (ExecExit, error) {
		return ExecExit{ExitCode: -1}, &errdefs.Error{Code: errdefs.CodeUnavailable, Message: "session stream: " + fmt.Sprintf(format, args...)}
	}
	for {
		t, p, err := ReadFrame(r, MaxFramePayload)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return broken("ended without an exit frame")
			}
			return broken("%v", err)
		}
		switch t {
		case FrameStdout, FrameStderr:
			out := stdout
			if t == FrameStderr {
				out = stderr
			}
			if out == nil {
				continue
			}
			if _, err := out.Write(p); err != nil {
				return ExecExit{ExitCode: -1}, fmt.Errorf("write session output: %w", err)
			}
		case FrameExit:
			var x ExecExit
			if len(p) > maxControl || DecodeStrict(p, &x) != nil {
				return broken("bad exit frame %q", trim(p))
			}
			return x, nil
		case FrameError:
			var b ErrorBody
			if len(p) > maxControl || json.Unmarshal(p, &b) != nil || b.Code == "" {
				return broken("bad error frame %q", trim(p))
			}
			return ExecExit{ExitCode: -1}, &errdefs.Error{Code: b.Code, Message: b.Message, RetryAfter: time.Duration(b.RetryAfterSec) * time.Second}
		default:
			return broken("unknown frame type %q", byte(t))
		}
	}
}

func trim(p []byte) []byte {
	if len(p) > 200 {
		return p[:200]
	}
	return p
}
