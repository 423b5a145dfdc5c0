// Package wire is the guest agent's protocol: length-prefixed frames over
// one Unix-socket connection per call. A frame is a type byte, a 4-byte
// big-endian payload length and the payload. The first frame of a call is
// the caller's Request (JSON); then both sides send frames until the call
// ends. Both ends read with a bound on every frame, so neither side can make
// the other buffer more than MaxPayload per frame.
//
// No net/http: the agent runs inside every guest (small, static), and the
// same framing carries a PTY session both ways at once.
package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Type is a frame's kind.
type Type byte

// Frame types. Caller → agent: Request, Stdin, StdinClose, Resize, Signal,
// Data, End (of a written file). Agent → caller: Stdout, Stderr, Exit,
// Error, Data, End, Result.
const (
	TRequest    Type = 'Q'
	TStdin      Type = 'i'
	TStdinClose Type = 'c'
	TResize     Type = 'z'
	TSignal     Type = 'k'
	TStdout     Type = 'o'
	TStderr     Type = 'e'
	TExit       Type = 'x'
	TError      Type = 'E'
	TData       Type = 'd'
	TEnd        Type = 'n'
	TResult     Type = 'r'
)

// MaxPayload bounds every frame's payload.
const MaxPayload = 64 << 10

// HeaderLen is a frame's header: the type byte and the payload length.
const HeaderLen = 5

// ErrFrame is wrapped by every framing error (oversized, truncated).
var ErrFrame = errors.New("bad frame")

// PutHeader fills h[:HeaderLen] with the header of a frame of type t and
// an n-byte payload, for writers that lay frames out in a buffer of their
// own (n must fit MaxPayload).
func PutHeader(h []byte, t Type, n int) {
	h[0] = byte(t)
	binary.BigEndian.PutUint32(h[1:HeaderLen], uint32(n))
}

// frames are WriteFrame's buffers: a frame is copied behind its header
// into one of them, so that it is one write, without a new buffer per
// frame (garbage and fresh pages are what a guest under ptrace pays most
// for).
var frames = sync.Pool{New: func() any { b := make([]byte, 0, HeaderLen+MaxPayload); return &b }}

// WriteFrame writes one frame. p must fit MaxPayload. To a *bufio.Writer
// the header and payload go as they are (it coalesces them, and
// frames, into its writes); to anything else as one write, so frames of
// concurrent writers (under the caller's lock) never interleave and a
// frame is one syscall.
func WriteFrame(w io.Writer, t Type, p []byte) error {
	if len(p) > MaxPayload {
		return fmt.Errorf("write frame %c: %d bytes: %w", t, len(p), ErrFrame)
	}
	var h [HeaderLen]byte
	PutHeader(h[:], t, len(p))
	if bw, ok := w.(*bufio.Writer); ok {
		bw.Write(h[:]) // a bufio.Writer's error sticks: the next Write returns it
		_, err := bw.Write(p)
		return err
	}
	bp := frames.Get().(*[]byte)
	buf := append(append((*bp)[:0], h[:]...), p...)
	_, err := w.Write(buf)
	*bp = buf[:0]
	frames.Put(bp)
	return err
}

// WriteJSON writes one frame whose payload is v as JSON.
func WriteJSON(w io.Writer, t Type, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame %c: %w", t, err)
	}
	return WriteFrame(w, t, p)
}

// ReadFrame reads one frame whose payload is at most max bytes (max ≤ 0 or
// above MaxPayload means MaxPayload) into buf (grown as needed; the
// returned payload aliases it). A longer frame is refused before its
// payload is read.
func ReadFrame(r io.Reader, buf []byte, max int) (Type, []byte, error) {
	if max <= 0 || max > MaxPayload {
		max = MaxPayload
	}
	var h [HeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, fmt.Errorf("read frame header: %w: truncated", ErrFrame)
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > uint32(max) {
		return 0, nil, fmt.Errorf("read frame %q: %d bytes, limit %d: %w", h[0], n, max, ErrFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, fmt.Errorf("read frame %q payload: %w: %w", h[0], ErrFrame, err)
	}
	return Type(h[0]), buf, nil
}

// NextFrame reads one frame from br as ReadFrame does (the same bounds,
// the same errors), but returns its payload inside br's buffer, valid
// until br's next read: no copy. br must hold a whole frame: Size() at
// least HeaderLen+max.
func NextFrame(br *bufio.Reader, max int) (Type, []byte, error) {
	if max <= 0 || max > MaxPayload {
		max = MaxPayload
	}
	if br.Size() < HeaderLen+max {
		return 0, nil, fmt.Errorf("read frame: a buffer of %d bytes cannot hold %d: %w", br.Size(), HeaderLen+max, ErrFrame)
	}
	h, err := br.Peek(HeaderLen)
	if err != nil {
		if len(h) > 0 && errors.Is(err, io.EOF) {
			return 0, nil, fmt.Errorf("read frame header: %w: truncated", ErrFrame)
		}
		return 0, nil, err
	}
	t, n := h[0], binary.BigEndian.Uint32(h[1:])
	if n > uint32(max) {
		return 0, nil, fmt.Errorf("read frame %q: %d bytes, limit %d: %w", t, n, max, ErrFrame)
	}
	f, err := br.Peek(HeaderLen + int(n))
	if err != nil {
		if errors.Is(err, io.EOF) && len(f) > HeaderLen {
			err = io.ErrUnexpectedEOF // as io.ReadFull says it
		}
		return 0, nil, fmt.Errorf("read frame %q payload: %w: %w", t, ErrFrame, err)
	}
	br.Discard(len(f))
	return Type(t), f[HeaderLen:], nil
}

// Decode parses p strictly into v: unknown fields, trailing data and
// anything but one JSON value are errors.
func Decode(p []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(p))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if d.More() {
		return errors.New("decode: trailing data")
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("decode: trailing data")
	}
	return nil
}

// Operations a Request names.
const (
	OpReady  = "ready"
	OpExec   = "exec"
	OpRead   = "read"
	OpWrite  = "write"
	OpStat   = "stat"
	OpList   = "list"
	OpMkdir  = "mkdir"
	OpRemove = "remove"
	OpRename = "rename"
	// OpClaim starts a warm agent's workload (Args, Env, Cwd, User) and
	// gives it the claim's Nonce: once, on an agent booted ahead with no
	// workload (a warm pool member, issue 27). Its result is a Ready with
	// the claim's nonce, sent once the workload started.
	OpClaim = "claim"
)

// User is who a call runs as; nil in a Request means the workload's user.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Request is a call's first frame.
type Request struct {
	Op   string `json:"op"`
	User *User  `json:"user,omitempty"`
	// exec
	Args      []string `json:"args,omitempty"`
	Env       []string `json:"env,omitempty"`
	Cwd       string   `json:"cwd,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	Rows      uint16   `json:"rows,omitempty"`
	Cols      uint16   `json:"cols,omitempty"`
	// files
	Path      string `json:"path,omitempty"`
	NewPath   string `json:"new_path,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	Limit     int64  `json:"limit,omitempty"` // read/write: the most bytes the agent moves
	// claim: the generation's readiness nonce and the guest's hostname
	Nonce    string `json:"nonce,omitempty"`
	Hostname string `json:"hostname,omitempty"`
}

// Resize is a TResize payload.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Signal is a TSignal payload.
type Signal struct {
	Signal int `json:"signal"`
}

// Exit is a TExit payload: the command's end.
type Exit struct {
	Code     int  `json:"code"`             // exit status, or -1 when killed by a signal
	Signal   int  `json:"signal,omitempty"` // the signal that ended it
	TimedOut bool `json:"timed_out,omitempty"`
}

// Error codes of a TError payload.
const (
	CodeInvalid    = "invalid"
	CodeNotFound   = "not_found"
	CodePermission = "permission"
	CodeExists     = "exists"
	CodeTooLarge   = "too_large"
	CodeInternal   = "internal"
	// CodeNotStarted answers ready when the workload could not start.
	CodeNotStarted = "not_started"
)

// Error is a TError payload: the call failed in the guest.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return "agent: " + e.Code + ": " + e.Message }

// Ready is the result of OpReady.
type Ready struct {
	Nonce string `json:"nonce"`
}

// Stat is the result of OpStat and an entry of OpList.
type Stat struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"` // Go fs.FileMode bits
	ModUnix int64  `json:"mtime"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Link    string `json:"link,omitempty"`
}

// Written is the result of OpWrite.
type Written struct {
	Bytes int64 `json:"bytes"`
}
