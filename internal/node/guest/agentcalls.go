package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// The calls that go to the guest agent of a sandbox's
// ready generation: exec, sessions and files, all through the guest's own
// view (its users, its mounts, its files). The agent is untrusted: the
// client bounds every answer; here its failures become errdefs codes, and
// a dead or hostile agent costs only this sandbox's calls (unavailable,
// naming the sandbox). Each call is an operation of the term (begin): the
// drain waits for it, and the term's end cuts it. Nothing here is kept in
// memory: the agent's socket derives from the journal's container id, so
// a new primary reaches the agents of adopted generations at once.

// agentCall is one call's target: the sandbox's ready generation and its
// agent, within an operation of the term.
type agentCall struct {
	ctx  context.Context
	done func()
	s    journal.Sandbox
	c    *client.Client
}

func (g *Guest) agentCall(ctx context.Context, id string) (*agentCall, error) {
	ctx, done, err := g.begin(ctx)
	if err != nil {
		return nil, err
	}
	s, err := g.ReadySandbox(id)
	if err != nil {
		done()
		return nil, err
	}
	return &agentCall{ctx: ctx, done: done, s: s, c: g.agentClient(s)}, nil
}

// fail maps a failed agent call to an errdefs error about what.
func (a *agentCall) fail(what string, err error) error {
	id, gen := a.s.ID, a.s.Generation
	var we *wire.Error
	switch {
	case errors.As(err, &we):
		code := errdefs.CodeInternal
		switch we.Code {
		case wire.CodeNotFound:
			code = errdefs.CodeNotFound
		case wire.CodePermission:
			code = errdefs.CodePermissionDenied
		case wire.CodeTooLarge, wire.CodeInvalid:
			code = errdefs.CodeInvalidArgument
		case wire.CodeExists:
			code = errdefs.CodeConflict
		}
		return errdefs.Errorf(code, "%s in sandbox %s: %s", what, id, we.Message)
	case errors.Is(err, client.ErrIdle):
		return errdefs.Errorf(errdefs.CodeUnavailable, "%s in sandbox %s: %v (the node's --exec-idle-timeout)", what, id, err)
	case errors.Is(err, client.ErrTooLarge), errors.Is(err, client.ErrListTooLarge):
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s in sandbox %s: %v", what, id, err)
	case a.ctx.Err() != nil:
		return errdefs.Errorf(errdefs.CodeUnavailable, "%s in sandbox %s: cancelled: %v", what, id, context.Cause(a.ctx))
	case errors.Is(err, client.ErrAgent):
		return errdefs.Errorf(errdefs.CodeUnavailable, "%s in sandbox %s: the guest agent of generation %d failed: %v (an operator may still use exec via runsc)", what, id, gen, err)
	}
	// The caller's side (its output writer, its input reader).
	return errdefs.Errorf(errdefs.CodeUnavailable, "%s in sandbox %s: %v", what, id, err)
}

// guestPath refuses a path the guest would resolve against the agent's
// working directory: every path of the API is absolute in the guest.
func guestPath(p string) error {
	if !path.IsAbs(p) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "path %q: must be absolute in the guest", p)
	}
	return nil
}

// ExecRequest is a command to run in a sandbox's guest.
type ExecRequest struct {
	Args, Env []string
	Cwd       string
	// Stdin is Exec's whole input (a session streams its own).
	Stdin []byte
	// TimeoutSec bounds the command (0: the node's default).
	TimeoutSec int64
	// User runs it as this uid and gid (nil: the workload's user).
	User *wire.User
	// TTY runs it on a pseudo-terminal of Rows x Cols (a session only).
	TTY        bool
	Rows, Cols uint16
}

// execTimeoutGrace is how much longer than an exec's own timeout (which
// the agent enforces by killing the group) the node waits for its exit.
const execTimeoutGrace = 10 * time.Second

func execRequest(req ExecRequest) client.ExecRequest {
	return client.ExecRequest{
		Args: req.Args, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Timeout: time.Duration(req.TimeoutSec) * time.Second, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols,
	}
}

// execBounds are the node's bounds of an exec: the timeout of one that
// names none, and the idle bound of one without a TTY (0: none).
type execBounds struct {
	timeout, idle time.Duration
}

func (g *Guest) execBounds() execBounds {
	return execBounds{timeout: g.cfg.ExecTimeoutDefault, idle: g.cfg.ExecIdle}
}

// exec runs req through the agent with streams s, within the node's
// bounds b: an exec without a timeout gets the node's default, so a
// silent agent cannot hold a node-wide exec slot for as long as its
// caller waits.
func (a *agentCall) exec(req ExecRequest, s client.Streams, b execBounds) (wire.Exit, error) {
	if len(req.Args) == 0 {
		return wire.Exit{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "exec: no args")
	}
	if req.TimeoutSec == 0 && b.timeout > 0 {
		req.TimeoutSec = int64((b.timeout + time.Second - 1) / time.Second)
	}
	ctx := a.ctx
	if req.TimeoutSec > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutSec)*time.Second+execTimeoutGrace)
		defer cancel()
	}
	cr := execRequest(req)
	if !req.TTY {
		cr.Idle = b.idle
	}
	e, err := a.c.Exec(ctx, cr, s)
	if err != nil {
		return e, a.fail("exec", err)
	}
	return e, nil
}

// Exec runs a command in the sandbox's guest through its agent, as req's
// user or else the workload's. A command its timeout ended is unavailable
// (as a runsc exec past its deadline was); one a signal ended exits 128+n.
func (g *Guest) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	a, err := g.agentCall(ctx, id)
	if err != nil {
		return -1, err
	}
	defer a.done()
	s := client.Streams{Stdout: stdout, Stderr: stderr}
	if len(req.Stdin) > 0 {
		s.Stdin = bytes.NewReader(req.Stdin)
	}
	req.TTY = false // a TTY needs a session's streams
	b := g.execBounds()
	e, err := a.exec(req, s, b)
	if err != nil {
		return -1, err
	}
	if e.TimedOut {
		t := time.Duration(req.TimeoutSec) * time.Second
		if req.TimeoutSec == 0 {
			t = b.timeout
		}
		return -1, errdefs.Errorf(errdefs.CodeUnavailable, "exec in %s: timed out after %v", id, t)
	}
	if e.Signal > 0 {
		return 128 + e.Signal, nil
	}
	return e.Code, nil
}

// Session runs a command with streamed stdin, an optional PTY, resizes
// and signals, through the sandbox's agent; the command's process group
// is killed when ctx ends.
func (g *Guest) Session(ctx context.Context, id string, req ExecRequest, s client.Streams) (wire.Exit, error) {
	a, err := g.agentCall(ctx, id)
	if err != nil {
		return wire.Exit{}, err
	}
	defer a.done()
	e, err := a.exec(req, s, g.execBounds())
	if err != nil {
		return wire.Exit{Code: -1}, err
	}
	return e, nil
}

// onAgent runs one file call, fn, on the agent of sandbox id after
// checking its guest paths; what names the call in its error.
func (g *Guest) onAgent(ctx context.Context, id, what string, paths []string, fn func(context.Context, *client.Client) error) error {
	for _, p := range paths {
		if err := guestPath(p); err != nil {
			return err
		}
	}
	a, err := g.agentCall(ctx, id)
	if err != nil {
		return err
	}
	defer a.done()
	if err := fn(a.ctx, a.c); err != nil {
		return a.fail(what, err)
	}
	return nil
}

// StatFile stats a guest file (a final symlink is not followed) as user
// (nil: the workload's).
func (g *Guest) StatFile(ctx context.Context, id, p string, user *wire.User) (wire.Stat, error) {
	var st wire.Stat
	err := g.onAgent(ctx, id, "stat "+p, []string{p}, func(ctx context.Context, c *client.Client) (err error) {
		st, err = c.Stat(ctx, p, user)
		return err
	})
	return st, err
}

// ListDir lists a guest directory (at most client.MaxList entries and the
// client's byte budget).
func (g *Guest) ListDir(ctx context.Context, id, p string, user *wire.User) ([]wire.Stat, error) {
	var sts []wire.Stat
	err := g.onAgent(ctx, id, "list "+p, []string{p}, func(ctx context.Context, c *client.Client) (err error) {
		sts, err = c.List(ctx, p, user)
		return err
	})
	if err != nil {
		return nil, err
	}
	return sts, nil
}

// MakeDir makes a guest directory (parents: and its parents).
func (g *Guest) MakeDir(ctx context.Context, id, p string, mode uint32, parents bool, user *wire.User) error {
	return g.onAgent(ctx, id, "mkdir "+p, []string{p}, func(ctx context.Context, c *client.Client) error {
		return c.Mkdir(ctx, p, mode, parents, user)
	})
}

// RemoveFile removes a guest file (recursive: a directory and its tree).
func (g *Guest) RemoveFile(ctx context.Context, id, p string, recursive bool, user *wire.User) error {
	return g.onAgent(ctx, id, "remove "+p, []string{p}, func(ctx context.Context, c *client.Client) error {
		return c.Remove(ctx, p, recursive, user)
	})
}

// RenameFile renames a guest file.
func (g *Guest) RenameFile(ctx context.Context, id, from, to string, user *wire.User) error {
	return g.onAgent(ctx, id, "rename "+from, []string{from, to}, func(ctx context.Context, c *client.Client) error {
		return c.Rename(ctx, from, to, user)
	})
}

// ReadFileTo streams a guest file to w, never whole, refusing one over
// limit (invalid_argument).
func (g *Guest) ReadFileTo(ctx context.Context, id, p string, user *wire.User, limit int64, w io.Writer) (int64, error) {
	if err := guestPath(p); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "read %s: limit %d: must be positive", p, limit)
	}
	a, err := g.agentCall(ctx, id)
	if err != nil {
		return 0, err
	}
	defer a.done()
	got, err := a.c.ReadFile(a.ctx, p, user, limit, w)
	if err != nil {
		return got, a.fail("read "+p, err)
	}
	return got, nil
}

// WriteFileFrom replaces a guest file with r (at most limit bytes),
// streamed; the agent replaces the file only once all of it arrived.
func (g *Guest) WriteFileFrom(ctx context.Context, id, p string, user *wire.User, mode uint32, limit int64, r io.Reader) (int64, error) {
	if err := guestPath(p); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "write %s: limit %d: must be positive", p, limit)
	}
	a, err := g.agentCall(ctx, id)
	if err != nil {
		return 0, err
	}
	defer a.done()
	if err := g.live(); err != nil {
		return 0, fmt.Errorf("write file: %w", err)
	}
	got, err := a.c.WriteFile(a.ctx, p, user, mode, limit, r)
	if err != nil {
		return got, a.fail("write "+p, err)
	}
	return got, nil
}

// ReadFile reads a guest file whole (at most limit bytes) through the
// agent, as the workload's user.
func (g *Guest) ReadFile(ctx context.Context, id, p string, limit int64) ([]byte, error) {
	var b bytes.Buffer
	if _, err := g.ReadFileTo(ctx, id, p, nil, limit, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteFile replaces a guest file with data through the agent, as the
// workload's user; the parent directory must exist.
func (g *Guest) WriteFile(ctx context.Context, id, p string, data []byte) error {
	_, err := g.WriteFileFrom(ctx, id, p, nil, 0o644, int64(max(len(data), 1)), bytes.NewReader(data))
	return err
}
