package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ctld/ctld/internal/api"
)

// Exit codes of exec and shell beyond the command's own (as a shell and
// timeout(1) report them).
const (
	exitTimedOut  = 124 // the node's --exec-timeout ended the command
	exitSignalled = 128 // + the signal that killed the command
)

// exitOf is the exit code ctl-manager ends with for a command's end.
func exitOf(x api.ExecExit) int {
	switch {
	case x.TimedOut:
		return exitTimedOut
	case x.Signal > 0:
		return exitSignalled + x.Signal
	case x.ExitCode < 0:
		return exitFailed // no exit code: the session failed
	}
	return x.ExitCode
}

// terminal is the local terminal of an interactive session.
type terminal interface {
	// Size is the terminal's size; false when there is none.
	Size() (api.TermSize, bool)
	// MakeRaw puts the local input in raw mode (keys go to the guest as
	// typed, ^C included) and returns what restores it.
	MakeRaw() (restore func(), err error)
	// Resized delivers a value on each change of the size until stop.
	Resized() (ch <-chan os.Signal, stop func())
}

// osTerminal is the process's terminal, when stdin and stdout are one.
type osTerminal struct{ in, out *os.File }

func (t osTerminal) Size() (api.TermSize, bool) {
	if t.out == nil || !term.IsTerminal(int(t.out.Fd())) {
		return api.TermSize{}, false
	}
	w, h, err := term.GetSize(int(t.out.Fd()))
	if err != nil || w < 1 || h < 1 || w > 0xffff || h > 0xffff {
		return api.TermSize{}, false
	}
	return api.TermSize{Rows: uint16(h), Cols: uint16(w)}, true
}

func (t osTerminal) MakeRaw() (func(), error) {
	if t.in == nil || !term.IsTerminal(int(t.in.Fd())) {
		return func() {}, nil
	}
	st, err := term.MakeRaw(int(t.in.Fd()))
	if err != nil {
		return nil, fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	return func() { _ = term.Restore(int(t.in.Fd()), st) }, nil
}

func (t osTerminal) Resized() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	return ch, func() { signal.Stop(ch) }
}

func (c *cli) terminal() terminal {
	if c.term != nil {
		return c.term
	}
	in, _ := c.stdin.(*os.File)
	out, _ := c.stdout.(*os.File)
	return osTerminal{in: in, out: out}
}

// defaultTermSize is a PTY's size when there is no local terminal.
var defaultTermSize = api.TermSize{Rows: 24, Cols: 80}

// session runs req as a session: streamed output, stdin when withStdin (or
// a TTY), and with req.TTY the local terminal in raw mode, its resizes
// sent as they happen. It ends with the command's exit code.
func (c *cli) session(ctx context.Context, id string, req api.ExecRequest, withStdin bool) error {
	m, done, err := c.manager(ctx, false)
	if err != nil {
		return err
	}
	defer done()
	s := api.Streams{Stdout: c.stdout, Stderr: c.stderr}
	if withStdin || req.TTY {
		s.Stdin = c.stdin
	}
	if req.TTY {
		t := c.terminal()
		sz, ok := t.Size()
		if !ok {
			sz = defaultTermSize
		}
		req.Rows, req.Cols = sz.Rows, sz.Cols
		restore, err := t.MakeRaw()
		if err != nil {
			return err
		}
		defer restore()
		resized, stop := t.Resized()
		defer stop()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s.Resize = forwardResizes(rctx, t, resized)
	}
	x, err := m.Session(ctx, id, req, s)
	if err != nil {
		return err
	}
	if code := exitOf(x); code != 0 {
		return exitCode(code)
	}
	return nil
}

// forwardResizes sends the terminal's size on each signal of resized
// until ctx ends; a size not yet sent is replaced by a newer one.
func forwardResizes(ctx context.Context, t terminal, resized <-chan os.Signal) <-chan api.TermSize {
	out := make(chan api.TermSize, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-resized:
			}
			sz, ok := t.Size()
			if !ok {
				continue
			}
			select {
			case <-out: // drop the stale size
			default:
			}
			out <- sz
		}
	}()
	return out
}

func (c *cli) execCommand() *cobra.Command {
	var env []string
	var cwd string
	var withStdin, tty, viaRunsc bool
	var timeout int64
	var user string
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming; exits with its exit code",
		Long: "Run a command in a sandbox through its guest agent. Output streams as it comes; with -i this " +
			"process's stdin streams to the command; -t runs it on a terminal (this terminal in raw mode, its resizes " +
			"forwarded). ctl-manager exits with the command's exit code, 128+N when signal N killed it, 124 when " +
			"--exec-timeout ended it. Ending ctl-manager (^C without -t) kills the command's process group in the guest. " +
			"--via-runsc runs it through `runsc exec` instead (the fallback when the agent does not answer; no -t, " +
			"stdin read whole first).",
		Args: func(cmd *cobra.Command, args []string) error {
			before, after := splitDash(cmd, args)
			if len(before) == 0 || len(args) < 2 {
				return usageError{errors.New("sandbox exec needs an ID and a command: exec ID -- CMD [ARGS...]")}
			}
			if len(before) > 1 && len(after) > 0 {
				return usageError{fmt.Errorf("sandbox exec takes one ID before \"--\", got %d", len(before))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&env, "env", nil, "environment (KEY=VALUE, repeatable)")
	f.StringVar(&cwd, "cwd", "", "working directory")
	f.BoolVarP(&withStdin, "stdin", "i", false, "stream this process's stdin to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal (interactive; implies -i)")
	f.BoolVar(&viaRunsc, "via-runsc", false, "run through `runsc exec` instead of the guest agent")
	f.Int64Var(&timeout, "exec-timeout", 0, "seconds the command may run (0: node default)")
	f.StringVar(&user, "user", "", "run as UID[:GID] (numeric; GID defaults to UID); default: the sandbox's process user")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if tty && viaRunsc {
			return usageError{errors.New("-t and --via-runsc do not go together: runsc exec is the fallback without a terminal")}
		}
		_, err := parseUser(user)
		return err
	}
	cmd.RunE = c.action(named("exec in sandbox"), func(ctx context.Context, args []string) error {
		id, argv := args[0], args[1:]
		u, _ := parseUser(user) // checked by PreRunE
		req := api.ExecRequest{Args: argv, Env: env, Cwd: cwd, TimeoutSec: timeout, User: u, TTY: tty}
		if !viaRunsc {
			return c.session(ctx, id, req, withStdin)
		}
		if withStdin {
			b, err := io.ReadAll(c.stdin)
			if err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			req.Stdin = b
		}
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		code, err := m.ExecViaRunsc(ctx, id, req, c.stdout, c.stderr)
		if err != nil {
			return err
		}
		if code != 0 {
			return exitCode(code)
		}
		return nil
	})
	return cmd
}

func (c *cli) shellCommand() *cobra.Command {
	var shell, user, cwd string
	cmd := &cobra.Command{
		Use:   "shell ID [--shell /bin/sh] [--user UID[:GID]]",
		Short: "Open an interactive shell in a sandbox (exec -t of its shell)",
		Args:  exactArgs(1, "ID"),
	}
	f := cmd.Flags()
	f.StringVar(&shell, "shell", "/bin/sh", "the shell to run")
	f.StringVar(&cwd, "cwd", "", "working directory")
	f.StringVar(&user, "user", "", "run as UID[:GID] (numeric); default: the sandbox's process user")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		_, err := parseUser(user)
		return err
	}
	body := c.action(named("shell in sandbox"), func(ctx context.Context, args []string) error {
		u, _ := parseUser(user)
		return c.session(ctx, args[0], api.ExecRequest{Args: []string{shell}, Cwd: cwd, User: u, TTY: true}, true)
	})
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// An interactive shell has no natural bound; --timeout cuts it
		// only when given.
		if !cmd.Flags().Changed("timeout") {
			c.timeout = 0
		}
		return body(cmd, args)
	}
	return cmd
}
