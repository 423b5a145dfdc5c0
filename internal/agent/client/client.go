// Package client is ctld's side of the guest agent. The agent runs inside
// an untrusted guest, so every answer is read with a bound per frame
// (wire.MaxPayload) and per call (result sizes, file limits), under the
// caller's context plus a deadline for calls that should be quick, and
// parsed strictly. A hostile or dead agent fails that call with an error
// wrapping ErrAgent; nothing else is spent on it.
package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/agent/wire"
)

// ErrAgent is wrapped by every failure of the agent itself (dead, silent,
// broken protocol), as opposed to a *wire.Error the agent answered.
var ErrAgent = errors.New("guest agent failed")

// maxSmall bounds a result, exit or error frame: small JSON only.
const maxSmall = 8 << 10

// MaxList bounds the entries of a directory listing the client accepts.
const MaxList = 100000

// Bounds of what one entry of the guest's file system may carry: a name
// (NAME_MAX) and a symlink target (PATH_MAX). Longer is a hostile agent.
const (
	MaxName = 255
	MaxLink = 4096
)

// DefaultListBudget is Client.ListBudget's default: a listing costs each
// entry's name and link target plus entryOverhead bytes; 100k entries with
// short names fit, 100k symlinks with 4 KiB targets (400 MiB) do not.
const DefaultListBudget = 16 << 20

// entryOverhead is what an entry costs ctld beyond its strings (the
// struct, its copy in the API's answer, the JSON around it), rounded up.
const entryOverhead = 128

// Client calls one agent. The zero value with Socket set is usable.
type Client struct {
	// Socket is the agent's Unix socket path on the host.
	Socket string
	// Dial replaces the default dialer (tests, a pinned connection).
	Dial func(ctx context.Context) (net.Conn, error)
	// CallTimeout bounds a call that is not an exec or a file stream
	// (ready, stat, list, mkdir, remove, rename); 0: 10 s.
	CallTimeout time.Duration
	// StreamIdle bounds each wait of a file stream: for the next frame of
	// a file read, for the agent to take the next frame of a file written,
	// and for its answer once all of it was sent (the file is then synced
	// and renamed in the guest); 0: DefaultStreamIdle. A silent agent
	// fails the call instead of holding it until the caller gives up.
	// Execs have no such bound: a command may be silent for as long as
	// it runs (its timeout bounds it).
	StreamIdle time.Duration
	// ListBudget bounds the bytes a directory listing may cost (names,
	// link targets and entryOverhead per entry); 0: DefaultListBudget.
	ListBudget int64
}

// DefaultStreamIdle is Client.StreamIdle's default: generous, as a busy
// guest's disk may stall a file stream for seconds.
const DefaultStreamIdle = time.Minute

func (c *Client) streamIdle() time.Duration {
	if c.StreamIdle > 0 {
		return c.StreamIdle
	}
	return DefaultStreamIdle
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var (
		nc  net.Conn
		err error
	)
	if c.Dial != nil {
		nc, err = c.Dial(ctx)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "unix", c.Socket)
	}
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w: %v", ErrAgent, err)
	}
	return nc, nil
}

// call is one connection: the request is sent and the context's end (or
// deadline) closes the connection, which ends any read or write.
type call struct {
	nc   net.Conn
	r    *bufio.Reader // frames are read through it: several per read when queued
	stop func() bool
	ctx  context.Context
	buf  []byte
}

// fileBuf is the buffer of a file stream's frames on this side: 4 frames
// per read or write of the socket; a read's payloads are used in place.
const fileBuf = 4 * (wire.HeaderLen + wire.MaxPayload)

// start dials and sends req; the call's reads are buffered by rbuf bytes
// (0: bufio's default).
func (c *Client) start(ctx context.Context, req wire.Request, rbuf int) (*call, error) {
	nc, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	if err := wire.WriteJSON(nc, wire.TRequest, req); err != nil {
		stop()
		nc.Close()
		return nil, c.failed(ctx, "send request", err)
	}
	if rbuf <= 0 {
		rbuf = 4096
	}
	return &call{nc: nc, r: bufio.NewReaderSize(nc, rbuf), stop: stop, ctx: ctx}, nil
}

func (k *call) close() {
	k.stop()
	k.nc.Close()
}

// errIdle is a stream's wait that passed its idle bound.
var errIdle = errors.New("the agent did not go on")

// idle bounds the connection's next reads (read) or writes to d from now,
// or to the call's own deadline if sooner. After the call's end the
// connection stays cut: the end may have set its deadline just before.
func (k *call) idle(d time.Duration, read bool) {
	dl := time.Now().Add(d)
	if cd, ok := k.ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	if read {
		k.nc.SetReadDeadline(dl)
	} else {
		k.nc.SetWriteDeadline(dl)
	}
	if k.ctx.Err() != nil {
		k.nc.SetDeadline(time.Unix(1, 0))
	}
}

// idleErr says a stream's wait passed its bound d (the call's context
// still live), else returns err unchanged.
func (k *call) idleErr(err error, d time.Duration, what string) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) || k.ctx.Err() != nil {
		return err
	}
	if dl, ok := k.ctx.Deadline(); ok && !time.Now().Before(dl) {
		return err // the call's own deadline, a moment before its context says so
	}
	return fmt.Errorf("%w: nothing %s for %v", errIdle, what, d)
}

func (c *Client) failed(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("agent %s: %w: %w", what, ErrAgent, context.Cause(ctx))
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The connection's deadline is the context's: it may fire a moment
		// before the context says so.
		return fmt.Errorf("agent %s: %w: %w", what, ErrAgent, context.DeadlineExceeded)
	}
	return fmt.Errorf("agent %s: %w: %v", what, ErrAgent, err)
}

// next reads one frame; frames other than Data/Stdout/Stderr must be small.
// On a call whose read buffer holds a whole frame (a file read) the
// payload is in that buffer, valid until the next call of next.
func (k *call) next() (wire.Type, []byte, error) {
	var (
		t   wire.Type
		p   []byte
		err error
	)
	if k.r.Size() >= wire.HeaderLen+wire.MaxPayload {
		t, p, err = wire.NextFrame(k.r, wire.MaxPayload)
	} else if t, p, err = wire.ReadFrame(k.r, k.buf, wire.MaxPayload); err == nil {
		k.buf = p[:0]
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("connection closed without an answer")
		}
		return 0, nil, err
	}
	switch t {
	case wire.TData, wire.TStdout, wire.TStderr:
	case wire.TResult, wire.TExit, wire.TError, wire.TEnd:
		if len(p) > maxSmall {
			return 0, nil, fmt.Errorf("frame %q of %d bytes, limit %d", t, len(p), maxSmall)
		}
	default:
		return 0, nil, fmt.Errorf("unexpected frame type %q", t)
	}
	return t, p, nil
}

// agentError parses an Error frame; a malformed one is a protocol error.
func agentError(p []byte) error {
	var e wire.Error
	if err := wire.Decode(p, &e); err != nil {
		return fmt.Errorf("error frame: %v", err)
	}
	if e.Code == "" {
		return errors.New("error frame without code")
	}
	return &e
}

func (c *Client) quick(ctx context.Context) (context.Context, context.CancelFunc) {
	d := c.CallTimeout
	if d <= 0 {
		d = 10 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

// result runs a call whose answer is one Result frame decoded into v.
func (c *Client) result(ctx context.Context, req wire.Request, v any) error {
	ctx, cancel := c.quick(ctx)
	defer cancel()
	k, err := c.start(ctx, req, 0)
	if err != nil {
		return err
	}
	defer k.close()
	t, p, err := k.next()
	if err != nil {
		return c.failed(ctx, req.Op, err)
	}
	switch t {
	case wire.TResult:
		if v == nil {
			return nil
		}
		if err := wire.Decode(p, v); err != nil {
			return c.failed(ctx, req.Op, fmt.Errorf("result: %v", err))
		}
		return nil
	case wire.TError:
		return wrapAgentErr(ctx, c, req.Op, p)
	}
	return c.failed(ctx, req.Op, fmt.Errorf("unexpected frame %q", t))
}

func wrapAgentErr(ctx context.Context, c *Client, op string, p []byte) error {
	err := agentError(p)
	var we *wire.Error
	if errors.As(err, &we) {
		return err
	}
	return c.failed(ctx, op, err)
}

// MaxNonce bounds the readiness answer.
const MaxNonce = 256

// Ready asks the agent for its generation's nonce.
func (c *Client) Ready(ctx context.Context) (string, error) {
	var r wire.Ready
	if err := c.result(ctx, wire.Request{Op: wire.OpReady}, &r); err != nil {
		return "", err
	}
	if len(r.Nonce) == 0 || len(r.Nonce) > MaxNonce {
		return "", c.failed(ctx, "ready", fmt.Errorf("nonce of %d bytes", len(r.Nonce)))
	}
	return r.Nonce, nil
}

// ClaimRequest is what a warm agent's claim starts (wire.OpClaim).
type ClaimRequest struct {
	Nonce     string
	User      wire.User
	Args, Env []string
	Cwd       string
	Hostname  string // "": the member's boot hostname
}

// Claim starts a warm agent's workload with the claim's nonce, user,
// args, env and cwd, and returns the nonce the agent answers with once
// the workload started: the claim's readiness proof in one round trip.
func (c *Client) Claim(ctx context.Context, r ClaimRequest) (string, error) {
	var out wire.Ready
	u := r.User
	req := wire.Request{Op: wire.OpClaim, User: &u, Args: r.Args, Env: r.Env, Cwd: r.Cwd, Nonce: r.Nonce, Hostname: r.Hostname}
	if err := c.result(ctx, req, &out); err != nil {
		return "", err
	}
	if len(out.Nonce) == 0 || len(out.Nonce) > MaxNonce {
		return "", c.failed(ctx, "claim", fmt.Errorf("nonce of %d bytes", len(out.Nonce)))
	}
	return out.Nonce, nil
}

// Stat describes a path (not following a final symlink).
func (c *Client) Stat(ctx context.Context, path string, u *wire.User) (wire.Stat, error) {
	var st wire.Stat
	if err := c.result(ctx, wire.Request{Op: wire.OpStat, Path: path, User: u}, &st); err != nil {
		return wire.Stat{}, err
	}
	if err := checkStat(st); err != nil {
		return wire.Stat{}, c.failed(ctx, "stat", err)
	}
	return st, nil
}

// checkStat refuses an entry no Linux file system has: a name longer than
// NAME_MAX (or with a NUL) and a link target longer than PATH_MAX.
func checkStat(st wire.Stat) error {
	if len(st.Name) > MaxName || strings.IndexByte(st.Name, 0) >= 0 {
		return fmt.Errorf("entry name of %d bytes (limit %d, no NUL)", len(st.Name), MaxName)
	}
	if len(st.Link) > MaxLink || strings.IndexByte(st.Link, 0) >= 0 {
		return fmt.Errorf("link target of %d bytes (limit %d, no NUL)", len(st.Link), MaxLink)
	}
	if st.Size < 0 {
		return fmt.Errorf("negative size %d", st.Size)
	}
	return nil
}

func (c *Client) listBudget() int64 {
	if c.ListBudget > 0 {
		return c.ListBudget
	}
	return DefaultListBudget
}

// ErrListTooLarge: a directory listing passed the entry or byte budget.
// The agent is not at fault (a guest may make such a directory), so it
// does not wrap ErrAgent.
var ErrListTooLarge = errors.New("directory listing too large")

// Mkdir makes a directory (with its parents when recursive).
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32, recursive bool, u *wire.User) error {
	return c.result(ctx, wire.Request{Op: wire.OpMkdir, Path: path, Mode: mode, Recursive: recursive, User: u}, nil)
}

// Remove removes a path (a whole tree when recursive).
func (c *Client) Remove(ctx context.Context, path string, recursive bool, u *wire.User) error {
	return c.result(ctx, wire.Request{Op: wire.OpRemove, Path: path, Recursive: recursive, User: u}, nil)
}

// Rename renames a path.
func (c *Client) Rename(ctx context.Context, from, to string, u *wire.User) error {
	return c.result(ctx, wire.Request{Op: wire.OpRename, Path: from, NewPath: to, User: u}, nil)
}

// List lists a directory: at most MaxList entries and ListBudget bytes,
// each a strict Stat; past either the call fails with ErrListTooLarge at
// once, having held at most the budget.
func (c *Client) List(ctx context.Context, path string, u *wire.User) ([]wire.Stat, error) {
	ctx, cancel := c.quick(ctx)
	defer cancel()
	req := wire.Request{Op: wire.OpList, Path: path, User: u}
	k, err := c.start(ctx, req, 0)
	if err != nil {
		return nil, err
	}
	defer k.close()
	var out []wire.Stat
	budget, cost := c.listBudget(), int64(0)
	for {
		t, p, err := k.next()
		if err != nil {
			return nil, c.failed(ctx, "list", err)
		}
		switch t {
		case wire.TData:
			var batch []wire.Stat
			if err := wire.Decode(p, &batch); err != nil {
				return nil, c.failed(ctx, "list", fmt.Errorf("entries: %v", err))
			}
			if len(out)+len(batch) > MaxList {
				return nil, fmt.Errorf("list %s: more than %d entries: %w", path, MaxList, ErrListTooLarge)
			}
			for _, st := range batch {
				if err := checkStat(st); err != nil {
					return nil, c.failed(ctx, "list", err)
				}
				cost += int64(len(st.Name)+len(st.Link)) + entryOverhead
			}
			if cost > budget {
				return nil, fmt.Errorf("list %s: more than %d bytes of entries: %w", path, budget, ErrListTooLarge)
			}
			out = append(out, batch...)
		case wire.TEnd:
			return out, nil
		case wire.TError:
			return nil, wrapAgentErr(ctx, c, "list", p)
		default:
			return nil, c.failed(ctx, "list", fmt.Errorf("unexpected frame %q", t))
		}
	}
}

// ReadFile streams a guest file into w: at most limit bytes (a longer
// stream fails the call), never buffered whole.
func (c *Client) ReadFile(ctx context.Context, path string, u *wire.User, limit int64, w io.Writer) (int64, error) {
	k, err := c.start(ctx, wire.Request{Op: wire.OpRead, Path: path, User: u, Limit: limit}, fileBuf)
	if err != nil {
		return 0, err
	}
	defer k.close()
	var n int64
	idle := c.streamIdle()
	for {
		k.idle(idle, true)
		t, p, err := k.next()
		if err != nil {
			return n, c.failed(ctx, "read", k.idleErr(err, idle, "arrived"))
		}
		switch t {
		case wire.TData:
			if n += int64(len(p)); limit > 0 && n > limit {
				return n, c.failed(ctx, "read", fmt.Errorf("past the limit of %d bytes", limit))
			}
			if _, err := w.Write(p); err != nil {
				return n, fmt.Errorf("read %s: write out: %w", path, err)
			}
		case wire.TEnd:
			return n, nil
		case wire.TError:
			return n, wrapAgentErr(ctx, c, "read", p)
		default:
			return n, c.failed(ctx, "read", fmt.Errorf("unexpected frame %q", t))
		}
	}
}

// WriteFile streams r into a guest file (replaced whole once all of it
// arrived), refusing more than limit bytes.
func (c *Client) WriteFile(ctx context.Context, path string, u *wire.User, mode uint32, limit int64, r io.Reader) (int64, error) {
	k, err := c.start(ctx, wire.Request{Op: wire.OpWrite, Path: path, User: u, Mode: mode, Limit: limit}, 0)
	if err != nil {
		return 0, err
	}
	defer k.close()
	// The agent may refuse while we send (too large, no permission): read
	// its answer concurrently so the refusal is what the caller sees.
	ans := make(chan error, 1)
	var written wire.Written
	idle := c.streamIdle()
	go func() {
		t, p, err := k.next()
		switch {
		case err != nil:
			ans <- c.failed(ctx, "write", k.idleErr(err, idle, "answered after the whole file was sent"))
		case t == wire.TResult:
			if err := wire.Decode(p, &written); err != nil {
				ans <- c.failed(ctx, "write", fmt.Errorf("result: %v", err))
				return
			}
			ans <- nil
		case t == wire.TError:
			ans <- wrapAgentErr(ctx, c, "write", p)
		default:
			ans <- c.failed(ctx, "write", fmt.Errorf("unexpected frame %q", t))
		}
	}()
	// Full frames, several per write of the socket: the input (an HTTP
	// body) may come in pieces of any size, and every frame and write costs
	// the guest syscalls.
	buf := make([]byte, wire.MaxPayload)
	w := bufio.NewWriterSize(k.nc, fileBuf)
	var sent int64
	var sendErr error
	for sendErr == nil {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			sent += int64(n)
			if limit > 0 && sent > limit {
				k.close()
				<-ans
				return sent, fmt.Errorf("write %s: more than %d bytes: %w", path, limit, ErrTooLarge)
			}
			k.idle(idle, false)
			if err := wire.WriteFrame(w, wire.TData, buf[:n]); err != nil {
				sendErr = k.idleErr(err, idle, "taken")
				break
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			k.idle(idle, false)
			if sendErr = wire.WriteFrame(w, wire.TEnd, nil); sendErr == nil {
				sendErr = w.Flush()
			}
			if sendErr == nil {
				// All sent: the answer comes within the bound.
				k.idle(idle, true)
			} else {
				sendErr = k.idleErr(sendErr, idle, "taken")
			}
			break
		}
		if err != nil {
			k.close()
			<-ans
			return sent, fmt.Errorf("write %s: read input: %w", path, err)
		}
	}
	if sendErr != nil {
		// The agent's refusal, if it sent one, is read; a deaf agent's
		// silence ends within the bound too.
		k.idle(idle, true)
	}
	aerr := <-ans
	if errors.Is(sendErr, errIdle) {
		return sent, c.failed(ctx, "write", sendErr)
	}
	if aerr != nil {
		return sent, aerr
	}
	if sendErr != nil {
		return sent, c.failed(ctx, "write", sendErr)
	}
	if written.Bytes != sent {
		return sent, c.failed(ctx, "write", fmt.Errorf("agent wrote %d of %d bytes", written.Bytes, sent))
	}
	return sent, nil
}

// ErrTooLarge: the caller's input exceeded the limit it gave.
var ErrTooLarge = errors.New("too large")

// Streams are an exec's input and output. Nil readers/writers are empty;
// Resize and Signal may be nil.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan wire.Resize
	Signal         <-chan int
}

// ExecRequest is a command to run.
type ExecRequest struct {
	Args, Env  []string
	Cwd        string
	User       *wire.User
	Timeout    time.Duration // the agent kills the group after it (0: none)
	TTY        bool
	Rows, Cols uint16
	// Idle, when positive, ends the call when for that long no output
	// arrived and no input was sent (a silent agent or command): the
	// connection is closed, so the agent kills the command's group. The
	// error wraps ErrIdle.
	Idle time.Duration
}

// ErrIdle: an exec passed its idle bound (ExecRequest.Idle).
var ErrIdle = errors.New("exec idle")

// Exec runs a command and streams its output in order per stream. The
// context's end closes the connection, and the agent then kills the
// command's process group.
func (c *Client) Exec(ctx context.Context, r ExecRequest, s Streams) (wire.Exit, error) {
	req := wire.Request{Op: wire.OpExec, Args: r.Args, Env: r.Env, Cwd: r.Cwd, User: r.User,
		TimeoutMS: r.Timeout.Milliseconds(), TTY: r.TTY, Rows: r.Rows, Cols: r.Cols}
	k, err := c.start(ctx, req, 0)
	if err != nil {
		return wire.Exit{}, err
	}
	defer k.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The idle bound is the read deadline, moved on by every frame either
	// way (input counts: a command being fed is not idle).
	active := func() {
		if r.Idle > 0 {
			k.idle(r.Idle, true)
		}
	}
	active()
	// Input: frames written under a lock (stdin, resize, signal).
	var wmu chanMutex = make(chan struct{}, 1)
	send := func(t wire.Type, v any, raw []byte) error {
		wmu.lock()
		defer wmu.unlock()
		active()
		if v != nil {
			return wire.WriteJSON(k.nc, t, v)
		}
		return wire.WriteFrame(k.nc, t, raw)
	}
	if s.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Stdin.Read(buf)
				if n > 0 && send(wire.TStdin, nil, buf[:n]) != nil {
					return
				}
				if err != nil {
					send(wire.TStdinClose, nil, nil)
					return
				}
			}
		}()
	} else {
		send(wire.TStdinClose, nil, nil)
	}
	if s.Resize != nil || s.Signal != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case rs, ok := <-s.Resize:
					if !ok {
						s.Resize = nil
						continue
					}
					send(wire.TResize, rs, nil)
				case sg, ok := <-s.Signal:
					if !ok {
						s.Signal = nil
						continue
					}
					send(wire.TSignal, wire.Signal{Signal: sg}, nil)
				}
			}
		}()
	}
	for {
		t, p, err := k.next()
		if err != nil {
			if r.Idle > 0 {
				if ie := k.idleErr(err, r.Idle, "arrived or was sent"); errors.Is(ie, errIdle) {
					return wire.Exit{}, fmt.Errorf("exec ended: %w: no output and no input for %v", ErrIdle, r.Idle)
				}
			}
			return wire.Exit{}, c.failed(ctx, "exec", err)
		}
		active()
		switch t {
		case wire.TStdout, wire.TStderr:
			w := s.Stdout
			if t == wire.TStderr {
				w = s.Stderr
			}
			if w != nil {
				if _, err := w.Write(p); err != nil {
					return wire.Exit{}, fmt.Errorf("exec: write output: %w", err)
				}
			}
		case wire.TExit:
			var e wire.Exit
			if err := wire.Decode(p, &e); err != nil {
				return wire.Exit{}, c.failed(ctx, "exec", fmt.Errorf("exit: %v", err))
			}
			if e.Code < -1 || e.Code > 255 || e.Signal < 0 || e.Signal > 64 {
				return wire.Exit{}, c.failed(ctx, "exec", fmt.Errorf("exit out of range: %+v", e))
			}
			return e, nil
		case wire.TError:
			return wire.Exit{}, wrapAgentErr(ctx, c, "exec", p)
		default:
			return wire.Exit{}, c.failed(ctx, "exec", fmt.Errorf("unexpected frame %q", t))
		}
	}
}

type chanMutex chan struct{}

func (m chanMutex) lock()   { m <- struct{}{} }
func (m chanMutex) unlock() { <-m }
