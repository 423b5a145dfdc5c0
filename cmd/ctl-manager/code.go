package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/snippet"
)

// sessionGuest runs a snippet's interpreter as a session (stdin streamed,
// the end's timeout and signal kept for the exit code); the files calls
// are the manager's.
type sessionGuest struct {
	*manager.Manager
	stdin io.Reader
	exit  *api.ExecExit
}

func (g sessionGuest) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	stdin := g.stdin
	if len(req.Stdin) > 0 {
		// The source itself (python3 -): a session streams it.
		stdin, req.Stdin = bytes.NewReader(req.Stdin), nil
	}
	x, err := g.Session(ctx, id, req, api.Streams{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	*g.exit = x
	return x.ExitCode, err
}

func (c *cli) codeCommand() *cobra.Command {
	var lang, file, source, cwd, user string
	var env []string
	var withStdin bool
	var timeout int64
	cmd := &cobra.Command{
		Use:   "code ID --language LANG (-f FILE|- | -c SOURCE) [flags]",
		Short: "Run a snippet of source in a sandbox with its language's interpreter; exits with its exit code",
		Long: "Run a snippet in a sandbox: the source goes into a file of a fresh private directory in the guest's /tmp " +
			"(never onto a command line), the language's interpreter (python: python3, node, bash, sh) runs it through " +
			"the guest agent, and the directory is removed after. Exit codes as exec's: the snippet's, 128+N when signal N " +
			"killed it, 124 when --exec-timeout ended it. The operator's command: it does not check the template's " +
			"languages (the service does).",
		Args: exactArgs(1, "ID"),
	}
	f := cmd.Flags()
	f.StringVarP(&lang, "language", "l", "", "the language: "+fmt.Sprint(snippet.Names()))
	f.StringVarP(&file, "file", "f", "", "the source file (- for this process's stdin)")
	f.StringVarP(&source, "code", "c", "", "the source itself")
	f.StringArrayVar(&env, "env", nil, "environment (KEY=VALUE, repeatable)")
	f.StringVar(&cwd, "cwd", "", "working directory")
	f.BoolVarP(&withStdin, "stdin", "i", false, "stream this process's stdin to the snippet (not with -f -)")
	f.Int64Var(&timeout, "exec-timeout", 0, "seconds the snippet may run (0: node default)")
	f.StringVar(&user, "user", "", "run as UID[:GID] (numeric); default: the sandbox's process user")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if _, err := snippet.Lookup(lang); err != nil {
			return usageError{fmt.Errorf("--language: %w", err)}
		}
		if (file == "") == (source == "") {
			return usageError{errors.New("give the source with one of -f FILE (- for stdin) and -c SOURCE")}
		}
		if file == "-" && withStdin {
			return usageError{errors.New("-f - reads the source from stdin: it cannot be the snippet's stdin too (-i)")}
		}
		_, err := parseUser(user)
		return err
	}
	cmd.RunE = c.action(named("code in sandbox"), func(ctx context.Context, args []string) error {
		src := []byte(source)
		if file != "" {
			var err error
			if src, err = readSource(file, c.stdin); err != nil {
				return err
			}
		}
		u, _ := parseUser(user)
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		var x api.ExecExit
		g := sessionGuest{Manager: m, exit: &x}
		if withStdin {
			g.stdin = c.stdin
		}
		req := snippet.Request{Language: lang, Source: src, Env: env, Cwd: cwd, TimeoutSec: timeout, User: u, StreamsStdin: withStdin}
		if _, err := (snippet.Runner{Guest: g, Log: c.logger()}).Run(ctx, args[0], req, c.stdout, c.stderr); err != nil {
			return err
		}
		if code := exitOf(x); code != 0 {
			return exitCode(code)
		}
		return nil
	})
	return cmd
}

// readSource reads a snippet's source from a file or stdin ("-"), at
// most snippet.MaxSourceBytes (one more is read to see it is too large).
func readSource(file string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usageError{fmt.Errorf("-f: %w", err)}
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, snippet.MaxSourceBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read the source: %w", err)
	}
	if len(b) > snippet.MaxSourceBytes {
		return nil, usageError{fmt.Errorf("the source is larger than %d bytes", snippet.MaxSourceBytes)}
	}
	return b, nil
}
