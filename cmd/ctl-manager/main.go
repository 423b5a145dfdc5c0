// Command ctl-manager is the thin manager and operator CLI of ctld: it keeps
// the lifecycle truth in SQLite and issues claims to ctld over its Unix
// socket.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/config"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Exit codes. A failed call exits 125, a code no command run by exec
// returns of itself (as in docker run and git bisect), so a guest's own
// exit 1 is never taken for a failure of ctl-manager or the node. exec and
// shell exit with the command's code (exec.go).
const (
	exitOK     = 0
	exitUsage  = 2
	exitFailed = 125
)

// cli holds the global flags and the process's streams; commands read
// everything from here, so tests run the whole CLI in-process.
type cli struct {
	config      string // ctld's configuration file (--config)
	socket      string
	db          string
	json        bool
	timeout     time.Duration
	verbose     bool
	busyRetries int

	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// ttyOut and ttyErr: stdout and stderr are terminals, where guest text
	// is printed with its control characters escaped (escape.go).
	ttyOut, ttyErr bool
	// term is the local terminal of exec -t (nil: the process's own).
	term terminal

	// ran is set once a command's action starts: an error before that is
	// a usage error (bad flag, wrong argument count, unknown command).
	ran bool
}

// usageError is a mistake in the command line (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

// exitCode ends the process with a code and no message (the guest's exit
// code of exec).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

// opError names what failed, for the one-line message.
type opError struct {
	what string
	err  error
}

func (e opError) Error() string { return e.what + ": " + e.err.Error() }
func (e opError) Unwrap() error { return e.err }

// errorLine renders an error as the single line ctl-manager prints:
// "ctl-manager: <what>: <code>: <message>" for API errors, local errors
// with their own wrapping otherwise.
func errorLine(err error) string {
	what, inner := "", err
	var oe opError
	if errors.As(err, &oe) {
		what, inner = oe.what+": ", oe.err
	}
	var ae *errdefs.Error
	if errors.As(inner, &ae) {
		line := "ctl-manager: " + what + string(ae.Code) + ": " + oneLine(ae.Message)
		if ae.RetryAfter > 0 {
			line += fmt.Sprintf(" (node busy: retry after %v)", ae.RetryAfter)
		}
		return line
	}
	return "ctl-manager: " + what + oneLine(inner.Error())
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	return runCLI(ctx, &cli{stdin: stdin, stdout: stdout, stderr: stderr, ttyOut: isTerminal(stdout), ttyErr: isTerminal(stderr)}, args, getenv)
}

// runCLI runs the command line with c's streams (and terminal).
func runCLI(ctx context.Context, c *cli, args []string, getenv func(string) string) int {
	stdin, stdout, stderr := c.stdin, c.stdout, c.stderr
	c.getenv = getenv
	root := c.rootCommand(getenv)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	var ec exitCode
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ec):
		return int(ec)
	case errors.As(err, &ue) || !c.ran:
		fmt.Fprintf(stderr, "ctl-manager: %s\nRun 'ctl-manager --help' for usage.\n", c.errText(oneLine(err.Error())))
		return exitUsage
	}
	fmt.Fprintln(stderr, c.errText(errorLine(err)))
	return exitFailed
}

func (c *cli) rootCommand(getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:           "ctl-manager",
		Short:         "Manage sandboxes on a ctld node",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	db := getenv("CTL_MANAGER_DB")
	if db == "" {
		db = manager.DefaultDBPath
	}
	pf := root.PersistentFlags()
	pf.StringVar(&c.config, "config", config.DefaultPath, "ctld's configuration file: the block store commands read the block store's settings from it")
	pf.StringVar(&c.socket, "socket", api.DefaultSocketPath, "ctld API socket")
	pf.StringVar(&c.db, "db", db, "manager database: a SQLite file, or a postgres:// URL (env CTL_MANAGER_DB)")
	pf.BoolVar(&c.json, "json", false, "print JSON")
	pf.DurationVar(&c.timeout, "timeout", 5*time.Minute, "give up after this long (0: never)")
	pf.BoolVarP(&c.verbose, "verbose", "v", false, "log what the manager does to stderr")
	pf.IntVar(&c.busyRetries, "busy-retries", 3, "send a claim or exec the node refused as busy again, after its retry hint, this many times")

	sandbox := group("sandbox", "Create, use and destroy sandboxes")
	sandbox.AddCommand(c.createCommand(), c.execCommand(), c.shellCommand(), c.lsCommand(), c.getCommand(), c.destroyCommand(), c.fileCommand(), c.logsCommand(), c.networkCommand())
	sandbox.AddCommand(c.volumeCommands()...)
	node := group("node", "Inspect the node")
	node.AddCommand(c.nodeStatusCommand(), c.nodeWithheldCommand())
	node.AddCommand(c.fleetCommands()...)
	proof := group("proof", "Check cleanup proofs")
	proof.AddCommand(c.proofVerifyCommand())
	root.AddCommand(sandbox, node, proof, c.templateCommand(getenv), c.volumeCommand(getenv), c.snapshotCommand(), c.storeCommand(getenv))
	root.AddCommand(c.serviceCommands()...)
	root.AddCommand(c.versionCommand())
	root.AddCommand(c.usageCommand())
	sandbox.AddCommand(c.codeCommand())
	root.AddCommand(c.codeCommand()) // `ctl-manager code ID` = `sandbox code ID`
	c.completeSandboxIDs(sandbox, c.findCommand(root, "snapshot"))
	return root
}

// findCommand is root's subcommand named name.
func (c *cli) findCommand(root *cobra.Command, name string) *cobra.Command {
	for _, cmd := range root.Commands() {
		if cmd.Name() == name {
			return cmd
		}
	}
	return &cobra.Command{}
}

// group is a command that only holds subcommands. Cobra would print help
// and exit 0 for a mistyped subcommand; here it is a usage error.
func group(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return usageError{fmt.Errorf("%s needs a subcommand", cmd.CommandPath())}
		},
	}
}

// action wraps a command body: it marks the start of the run (errors from
// here on are not usage errors), applies --timeout, and names the failure.
func (c *cli) action(what func(args []string) string, fn func(ctx context.Context, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c.ran = true
		ctx := cmd.Context()
		if c.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.timeout)
			defer cancel()
		}
		err := fn(ctx, args)
		if err != nil && c.timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Say what was waited for, not only that a deadline passed.
			err = fmt.Errorf("gave up after %s (--timeout) waiting for ctld to answer on %s: %w", c.timeout, c.socket, err)
		}
		var ue usageError
		var ec exitCode
		if err == nil || errors.As(err, &ue) || errors.As(err, &ec) {
			return err
		}
		return opError{what: what(args), err: err}
	}
}

func (c *cli) logger() *slog.Logger {
	level := slog.LevelError + 1 // quiet: failures are reported as one line
	if c.verbose {
		level = slog.LevelDebug
	}
	return logging.New(c.stderr, level)
}

// manager builds the Manager; commands that only talk to the node (exec,
// files) do not open the database.
func (c *cli) manager(ctx context.Context, withStore bool) (*manager.Manager, func(), error) {
	m := &manager.Manager{Client: &api.Client{SocketPath: c.socket}, Log: c.logger(), BusyRetries: c.busyRetries}
	if !withStore {
		return m, func() {}, nil
	}
	st, err := manager.Open(ctx, c.db, nil)
	if err != nil {
		return nil, nil, err
	}
	m.Store = st
	return m, func() { st.Close() }, nil
}

// managerAction is an action over a Manager (c.manager's, withStore
// saying whether with the database): opened before fn, closed after it.
func (c *cli) managerAction(what func([]string) string, withStore bool, fn func(ctx context.Context, m *manager.Manager, args []string) error) func(*cobra.Command, []string) error {
	return c.action(what, func(ctx context.Context, args []string) error {
		m, done, err := c.manager(ctx, withStore)
		if err != nil {
			return err
		}
		defer done()
		return fn(ctx, m, args)
	})
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

func named(verb string) func([]string) string {
	return func(args []string) string {
		if len(args) > 0 {
			return verb + " " + args[0]
		}
		return verb
	}
}

func fixed(what string) func([]string) string { return func([]string) string { return what } }

// splitDash separates ID arguments from the command after "--".
func splitDash(cmd *cobra.Command, args []string) (before, after []string) {
	if i := cmd.ArgsLenAtDash(); i >= 0 {
		return args[:i], args[i:]
	}
	return args, nil
}

func (c *cli) createCommand() *cobra.Command {
	var cpu, memory, disk, template, mode, cwd, user string
	var pids, lifetime int64
	var env, vols []string
	var nf networkFlags
	cmd := &cobra.Command{
		Use:   "create ID [flags] [-- CMD ARGS...]",
		Short: "Create a sandbox (claim its next generation)",
		Args: func(cmd *cobra.Command, args []string) error {
			if before, _ := splitDash(cmd, args); len(before) != 1 {
				return usageError{fmt.Errorf("sandbox create takes one ID before \"--\", got %d", len(before))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cpu, "cpu", "500m", "CPU: millicores (500m) or cores (0.5, 2)")
	f.StringVar(&memory, "memory", "256Mi", "memory: 256Mi, 1Gi, 512M or bytes")
	f.Int64Var(&pids, "pids", 256, "maximum number of processes")
	f.StringVar(&disk, "disk", "", "disk lease of the RootFS: 1Gi, 512Mi or bytes (empty: the node's default)")
	f.StringVar(&template, "template", "busybox", "RootFS template")
	f.StringVar(&mode, "mode", string(api.RootFSOverlay), "RootFS mode")
	f.StringArrayVar(&env, "env", nil, "environment of the main process (KEY=VALUE, repeatable)")
	f.StringVar(&cwd, "cwd", "", "working directory of the main process (default: the template image's)")
	f.StringVar(&user, "user", "", "UID[:GID] of the main process, numeric (default: the template image's user, else root)")
	f.Int64Var(&lifetime, "max-lifetime", 0, "seconds until the node releases it (0: none)")
	onExit := f.String("on-exit", "", "when its main process exits: keep (default: state exited until released) or release (released with its proof)")
	f.StringArrayVar(&vols, "volume", nil, "attach persistent volume ID at PATH in the guest (ID:/PATH, repeatable; block store volumes, see `volume create`)")
	nf.register(f, "network", string(api.NetworkDenyAll))
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if _, err := parseVolumeMounts(vols); err != nil {
			return err
		}
		_, err := nf.policy()
		return err
	}
	cmd.RunE = c.action(named("create sandbox"), func(ctx context.Context, args []string) error {
		ids, proc := splitDash(cmd, args)
		network, _ := nf.policy() // checked by PreRunE
		mounts, _ := parseVolumeMounts(vols)
		millis, err := manager.ParseCPU(cpu)
		if err != nil {
			return usageError{fmt.Errorf("--cpu: %w", err)}
		}
		mem, err := manager.ParseMemory(memory)
		if err != nil {
			return usageError{fmt.Errorf("--memory: %w", err)}
		}
		u, err := parseUser(user)
		if err != nil {
			return err
		}
		var diskBytes int64
		if disk != "" {
			if diskBytes, err = manager.ParseMemory(disk); err != nil {
				return usageError{fmt.Errorf("--disk: %w", err)}
			}
		}
		m, done, err := c.manager(ctx, true)
		if err != nil {
			return err
		}
		defer done()
		res, err := m.Create(ctx, ids[0], manager.Spec{
			Resources:      api.Resources{CPUMillis: millis, MemoryBytes: mem, PIDs: pids, DiskBytes: diskBytes},
			RootFS:         api.RootFS{Mode: api.RootFSMode(mode), Template: template},
			Network:        network,
			Process:        api.Process{Args: proc, Env: env, Cwd: cwd},
			MaxLifetimeSec: lifetime,
			Volumes:        mounts,
			User:           u,
			OnExit:         *onExit,
		})
		if err != nil {
			if res.OperationID != "" && !res.Reused && errdefs.CodeOf(err) == errdefs.CodeUnavailable {
				err = fmt.Errorf("%w (operation %s stays pending; run create again to retry it)", err, res.OperationID)
			}
			return err
		}
		if c.json {
			return c.printJSON(res)
		}
		sb, t := res.Sandbox, res.Sandbox.Timings
		fmt.Fprintf(c.stdout, "sandbox %s %s: generation %d, container %s, lease %s\n", sb.ID, sb.State, sb.Generation, sb.ContainerID, sb.LeaseID)
		fmt.Fprintf(c.stdout, "timings: total %.0f ms (lease %.0f, rootfs %.0f, network %.0f, runsc %.0f, proof %.0f)\n",
			t.TotalMS, t.LeaseMS, t.RootFSMS, t.NetworkMS, t.RunscMS, t.ProofMS)
		reused := ""
		if res.Reused {
			reused = " (retried)"
		}
		fmt.Fprintf(c.stdout, "operation %s%s\n", res.OperationID, reused)
		return nil
	})
	return cmd
}

// parseUser parses --user UID[:GID]: numeric ids only (the guest's
// /etc/passwd is the guest's business); GID defaults to UID. Empty means
// no user: the node runs the command as the sandbox's process user.
func parseUser(s string) (*api.User, error) {
	if s == "" {
		return nil, nil
	}
	us, gs, hasGID := strings.Cut(s, ":")
	if !hasGID {
		gs = us
	}
	uid, err1 := strconv.ParseUint(us, 10, 32)
	gid, err2 := strconv.ParseUint(gs, 10, 32)
	if err1 != nil || err2 != nil || (hasGID && gs == "") {
		return nil, usageError{fmt.Errorf("--user %q: want UID[:GID], numeric", s)}
	}
	return &api.User{UID: uint32(uid), GID: uint32(gid)}, nil
}

func (c *cli) lsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "ls", Short: "List sandboxes (manager's record merged with the node's)", Args: noArgs}
	cmd.RunE = c.managerAction(fixed("list sandboxes"), true, func(ctx context.Context, m *manager.Manager, _ []string) error {
		l, err := m.Ls(ctx)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(l)
		}
		if l.NodeError != "" {
			fmt.Fprintf(c.stderr, "ctl-manager: warning: node not reachable, showing the manager's record only: %s\n", oneLine(l.NodeError))
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tGEN\tSTATE\tNODE STATE\tCPU\tMEMORY\tSTATUS")
		for _, e := range l.Sandboxes {
			gen, state, nodeState, cpu, mem := "-", "-", "-", "-", "-"
			if e.Store != nil {
				gen, state = fmt.Sprint(e.Store.Generation), string(e.Store.State)
			}
			if e.Node != nil {
				nodeState = string(e.Node.State)
				if e.Store == nil {
					gen = fmt.Sprint(e.Node.Generation)
				}
				cpu, mem = manager.FormatCPU(e.Node.Resources.CPUMillis), manager.FormatMemory(e.Node.Resources.MemoryBytes)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, gen, state, nodeState, cpu, mem, e.Status)
		}
		return tw.Flush()
	})
	return cmd
}

func noArgs(_ *cobra.Command, args []string) error {
	if len(args) != 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", args)}
	}
	return nil
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s, got %d arguments", cmd.CommandPath(), names, len(args))}
		}
		return nil
	}
}

func (c *cli) getCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "get ID", Short: "Show one sandbox: record, generations, operations, node view", Args: exactArgs(1, "ID")}
	cmd.RunE = c.managerAction(named("get sandbox"), true, func(ctx context.Context, m *manager.Manager, args []string) error {
		d, err := m.Get(ctx, args[0])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(d)
		}
		c.printDetail(args[0], d)
		return nil
	})
	return cmd
}

func (c *cli) printDetail(id string, d manager.Detail) {
	w := c.stdout
	fmt.Fprintf(w, "sandbox %s\n", id)
	if s := d.Sandbox; s != nil {
		fmt.Fprintf(w, "  recorded:   %s, generation %d, node %s, created %s\n", s.State, s.Generation, s.NodeID, s.CreatedAt.Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "  recorded:   not known to the manager\n")
	}
	switch n := d.Node; {
	case n != nil:
		fmt.Fprintf(w, "  on node:    %s, generation %d, container %s, lease %s, epoch %d, oom kills %d\n", n.State, n.Generation, n.ContainerID, n.LeaseID, n.Epoch, n.OOMKills)
		fmt.Fprintf(w, "  resources:  cpu %s, memory %s, pids %d, disk %s\n", manager.FormatCPU(n.Resources.CPUMillis), manager.FormatMemory(n.Resources.MemoryBytes), n.Resources.PIDs, manager.FormatMemory(n.Resources.DiskBytes))
		if n.Network != nil {
			fmt.Fprintf(w, "  network:    %s\n", networkLine(n.Network, ""))
		}
		if wr := n.Writer; wr != nil {
			fmt.Fprintf(w, "  writer:     %s, pid %d, epoch %d, restarts %d\n", dash(wr.Device), wr.PID, wr.Epoch, wr.Restarts)
		}
		if n.Reason != "" {
			fmt.Fprintf(w, "  reason:     %s\n", n.Reason)
		}
	case d.NodeError != "":
		fmt.Fprintf(w, "  on node:    unknown (%s)\n", oneLine(d.NodeError))
	default:
		fmt.Fprintf(w, "  on node:    absent\n")
	}
	if len(d.Generations) > 0 {
		fmt.Fprintln(w, "generations:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  GEN\tSTATE\tCONTAINER\tLEASE\tCPU\tMEMORY\tTOTAL MS\tCREATED")
		for _, g := range d.Generations {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\n", g.Generation, g.State, dash(g.ContainerID), dash(g.LeaseID),
				manager.FormatCPU(g.Resources.CPUMillis), manager.FormatMemory(g.Resources.MemoryBytes), g.Timings.TotalMS, g.CreatedAt.Format(time.RFC3339))
		}
		tw.Flush()
	}
	if len(d.Operations) > 0 {
		fmt.Fprintln(w, "operations:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  OPERATION\tKIND\tGEN\tSTATE\tERROR")
		for _, o := range d.Operations {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\n", o.OperationID, o.Kind, o.Generation, o.State, dash(oneLine(o.Error)))
		}
		tw.Flush()
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// errProofNotAccepted makes destroy and proof verify fail (exit 125) after printing
// the verdict: the release happened, but its cleanup is not proven.
var errProofNotAccepted = errors.New("cleanup proof not accepted")

func (c *cli) destroyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "destroy ID", Short: "Release a sandbox and verify its cleanup proof", Args: exactArgs(1, "ID")}
	cmd.RunE = c.managerAction(named("destroy sandbox"), true, func(ctx context.Context, m *manager.Manager, args []string) error {
		res, err := m.Destroy(ctx, args[0])
		if err != nil {
			return err
		}
		return c.printRelease(res, res.Verdict, func() {
			note := ""
			if res.AlreadyReleased {
				note = " (already)"
			}
			fmt.Fprintf(c.stdout, "sandbox %s generation %d released%s, operation %s\n", res.Sandbox.ID, res.Sandbox.Generation, note, res.OperationID)
		})
	})
	return cmd
}

// printRelease prints the answer res of a release (destroy, pause): as
// JSON, or lines() then the verdict; a proof the verdict does not accept
// fails the command after it is printed.
func (c *cli) printRelease(res any, v manager.Verdict, lines func()) error {
	if c.json {
		if err := c.printJSON(res); err != nil {
			return err
		}
	} else {
		lines()
		fmt.Fprintln(c.stdout, v.String())
	}
	if !v.OK() {
		return fmt.Errorf("%w: %s", errProofNotAccepted, verdictReason(v))
	}
	return nil
}

func verdictReason(v manager.Verdict) string {
	if !v.Verified {
		return v.Reason
	}
	return "failed checks: " + strings.Join(v.FailedChecks, ", ")
}

func (c *cli) logsCommand() *cobra.Command {
	var follow, runsc bool
	var tail int
	var idle time.Duration
	cmd := &cobra.Command{
		Use:   "logs ID [--follow] [--tail N] [--runsc]",
		Short: "Print the output of a sandbox's main process (kept on the node up to its log cap)",
		Long: "Print what the sandbox's main process wrote to stdout and stderr, as far as the node keeps it " +
			"(the latest --log-max-bytes of ctld). --follow keeps printing new output until the generation ends, " +
			"nothing comes for --idle, or the primary hands over; the reason is printed to stderr. " +
			"--follow is not cut by --timeout unless --timeout is given.",
		Args: exactArgs(1, "ID"),
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	f.IntVar(&tail, "tail", 0, "print only the last N lines (0: all the node keeps)")
	f.BoolVar(&runsc, "runsc", false, "print runsc's own log of the generation instead")
	f.DurationVar(&idle, "idle", api.DefaultLogIdleSec*time.Second, "with --follow: stop after this long without output (1s to 1h)")
	body := c.action(named("logs of sandbox"), func(ctx context.Context, args []string) error {
		req := api.LogsRequest{Tail: tail, Follow: follow}
		if runsc {
			req.Source = api.LogSourceRunsc
		}
		if follow {
			if idle < time.Second || idle > api.MaxLogIdleSec*time.Second {
				return usageError{fmt.Errorf("--idle must be between 1s and %ds, got %v", api.MaxLogIdleSec, idle)}
			}
			req.IdleSec = int64(idle / time.Second)
		}
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		end, err := m.Logs(ctx, args[0], req, c.stdout)
		if err != nil {
			if follow && ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("stopped following after --timeout %v (the generation still runs)", c.timeout)
			}
			return err
		}
		if follow {
			fmt.Fprintf(c.stderr, "ctl-manager: follow of sandbox %s generation %d ended: %s\n", args[0], end.Generation, end.Reason)
		}
		return nil
	})
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// A follow has its own bound (--idle, the generation's end); the
		// default --timeout would cut it for no reason.
		if follow && !cmd.Flags().Changed("timeout") {
			c.timeout = 0
		}
		return body(cmd, args)
	}
	return cmd
}

func (c *cli) nodeStatusCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "status", Short: "Show the node's identity, role and capacity", Args: noArgs}
	cmd.RunE = c.managerAction(fixed("node status"), true, func(ctx context.Context, m *manager.Manager, _ []string) error {
		st, err := m.NodeStatus(ctx)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(st)
		}
		n, w := st.Node, c.stdout
		fmt.Fprintf(w, "node %s (boot %s)\n", n.NodeID, n.BootID)
		fmt.Fprintf(w, "  slot %s, role %s, epoch %d\n", n.Slot, n.Role, n.Epoch)
		fmt.Fprintf(w, "  versions: ctld %s, kernel %s, runsc %s, nft %s\n", n.Versions.Ctld, n.Versions.Kernel, n.Versions.Runsc, n.Versions.Nft)
		key := "not pinned yet (pinned from the first cleanup proof)"
		if len(st.Record.PublicKey) > 0 {
			key = fmt.Sprintf("%x (pinned %s)", st.Record.PublicKey, st.Record.FirstSeen.Format(time.RFC3339))
		}
		fmt.Fprintf(w, "  key: %s\n", key)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CAPACITY\tCPU\tMEMORY\tPIDS\tNBD\tADDRESSES\tDISK")
		row := func(name string, c api.Capacity) {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%s\n", name, manager.FormatCPU(c.CPUMillis), manager.FormatMemory(c.MemoryBytes), c.PIDs, c.NBDDevices, c.Addresses, manager.FormatMemory(c.DiskBytes))
		}
		row("total", n.Capacity.Total)
		row("allocatable", n.Capacity.Allocatable)
		row("leased", n.Capacity.Leased)
		row("warm", n.Capacity.Warm)
		row("withheld", n.Capacity.Withheld)
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, wl := range n.Withheld {
			fmt.Fprintf(w, "  withheld: %s generation %d: %s\n", wl.SandboxID, wl.Generation, wl.Reason)
		}
		return nil
	})
	return cmd
}

// nodeWithheldCommand lists the generations whose cleanup is unproven,
// with the failed checks of each one's latest proof and its retries. It
// only asks the node (no manager database).
func (c *cli) nodeWithheldCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "withheld", Short: "List withheld generations (unproven cleanup) with their failed checks", Args: noArgs}
	cmd.RunE = c.managerAction(fixed("node withheld"), false, func(ctx context.Context, m *manager.Manager, _ []string) error {
		n, err := m.Client.Node(ctx)
		if err != nil {
			return err
		}
		ws := n.Withheld
		if ws == nil {
			ws = []api.WithheldLease{}
		}
		if c.json {
			return c.printJSON(ws)
		}
		w := c.stdout
		if len(ws) == 0 {
			fmt.Fprintln(w, "no withheld generations")
			return nil
		}
		when := func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.Format(time.RFC3339)
		}
		for _, wl := range ws {
			fmt.Fprintf(w, "%s generation %d: %s cpu, %s memory, %d pids withheld\n", wl.SandboxID, wl.Generation,
				manager.FormatCPU(wl.Resources.CPUMillis), manager.FormatMemory(wl.Resources.MemoryBytes), wl.Resources.PIDs)
			fmt.Fprintf(w, "  retries: %d, last %s, next %s; latest proof: %s\n", wl.RetryAttempts, when(wl.LastAttempt), when(wl.NextAttempt), wl.ProofOperationID)
			if len(wl.FailedChecks) == 0 {
				fmt.Fprintf(w, "  reason: %s\n", wl.Reason)
			}
			for _, ch := range wl.FailedChecks {
				fmt.Fprintf(w, "  FAILED %-22s %s\n", ch.Name, ch.Detail)
			}
		}
		return nil
	})
	return cmd
}

func (c *cli) proofVerifyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "verify OPERATION_ID", Short: "Verify the cleanup proof of a release", Args: exactArgs(1, "OPERATION_ID")}
	cmd.RunE = c.managerAction(named("verify proof"), true, func(ctx context.Context, m *manager.Manager, args []string) error {
		v, err := m.VerifyProof(ctx, args[0])
		if err != nil {
			return err
		}
		if c.json {
			if err := c.printJSON(v); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(c.stdout, v.String())
			for _, ch := range v.Proof.Checks {
				mark := "ok"
				if !ch.OK {
					mark = "FAILED"
				}
				fmt.Fprintf(c.stdout, "  %-24s %s %s\n", ch.Name, mark, ch.Detail)
			}
		}
		if !v.OK() {
			return fmt.Errorf("%w: %s", errProofNotAccepted, verdictReason(v))
		}
		return nil
	})
	return cmd
}
