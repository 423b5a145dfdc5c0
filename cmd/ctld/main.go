// Command ctld is the node authority of a sandbox host. Two instances
// (`ctld run --slot a` and `--slot b`) elect one primary by flock; the
// primary serves the local API. `ctld status` and `ctld doctor` are for
// operators.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ctld/ctld/internal/config"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/logging"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type globalOpts struct {
	stateDir string
	runDir   string
	// config is the configuration file (--config); explicit when given.
	config string
}

// globalFlags registers the flags every command has.
func globalFlags(f *pflag.FlagSet, g *globalOpts) {
	f.StringVar(&g.stateDir, "state-dir", "/var/lib/ctld", "state directory shared by slots a and b")
	f.StringVar(&g.runDir, "run-dir", "/run/ctld", "runtime directory (sockets, runsc state, bundles)")
}

func main() {
	// Only `ctld run` and `ctld writer` handle SIGTERM/SIGINT (run drains its
	// term first, writer releases its device);
	// the other commands, the log writer among them, die of them as usual.
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError is a mistake in the command line (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run is the whole CLI: main only calls it, so tests run ctld in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var g globalOpts
	// ran is set once a command's action starts: an error before that is a
	// usage error (bad flag, wrong argument count, unknown command).
	ran := false
	root := &cobra.Command{
		Use:           "ctld",
		Short:         "node authority of a gVisor sandbox host",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			ran = true
			if err := applyConfig(cmd, g.config); err != nil {
				return usageError{err} // a setting's mistake, like a flag's
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	globalFlags(root.PersistentFlags(), &g)
	root.PersistentFlags().StringVar(&g.config, "config", config.DefaultPath, "configuration file: settings named as the flags of `ctld run` (a missing default file is none)")
	root.AddCommand(runCmd(&g), statusCmd(&g), doctorCmd(&g), versionCmd(), logshimCmd(), writerCmd(), keyCmd(&g), configCmd())
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue) || !ran:
		fmt.Fprintf(stderr, "ctld: %v\nRun 'ctld --help' for usage.\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "ctld: %v\n", err)
	if code, ok := asExitCode(err); ok {
		return code
	}
	return exitError
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version) },
	}
}

func statusCmd(g *globalOpts) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status",
		Short: "show the role and epoch of slots a and b, and the primary's warm pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			type row struct {
				Slot   string     `json:"slot"`
				Status *ha.Status `json:"status,omitempty"`
				Error  string     `json:"error,omitempty"`
			}
			var rows []row
			for _, slot := range []string{"a", "b"} {
				// Each slot gets its own bound, so a wedged instance cannot
				// hide the other one.
				ctx, cancel := context.WithTimeout(cmd.Context(), probeTimeout)
				st, err := ha.Probe(ctx, probePath(g.runDir, slot))
				cancel()
				r := row{Slot: slot}
				if err != nil {
					r.Error = fmt.Sprintf("no answer on %s within %s: %v", probePath(g.runDir, slot), probeTimeout, err)
				} else {
					r.Status = &st
				}
				rows = append(rows, r)
			}
			epoch, eerr := ha.ReadEpoch(g.stateDir)
			// The primary's warm pools (GET /v1/node), when there is one.
			var wp *statusWarm
			for _, r := range rows {
				if r.Status != nil && r.Status.Role == ha.RolePrimary && wp == nil {
					s := readStatusWarm(cmd.Context(), g.runDir)
					wp = &s
				}
			}
			if asJSON {
				out := map[string]any{"slots": rows, "epoch": epoch}
				if wp != nil {
					out["warm"] = wp
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			for _, r := range rows {
				if r.Status == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "ctld@%s  down     (%s)\n", r.Slot, r.Error)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "ctld@%s  %-8s epoch %d  pid %d  health %s  since %s\n", r.Slot, r.Status.Role, r.Status.Epoch, r.Status.PID, r.Status.Health, r.Status.Since.Format(time.RFC3339))
			}
			if eerr == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "durable epoch %d (%s)\n", epoch, ha.EpochPath(g.stateDir))
			}
			if wp != nil {
				wp.print(cmd.OutOrStdout())
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// probeTimeout bounds how long `ctld status` waits for each instance.
const probeTimeout = 2 * time.Second

// apiSocketPath is the primary's API socket in runDir.
func apiSocketPath(runDir string) string { return filepath.Join(runDir, "ctld.sock") }

func probePath(runDir, slot string) string {
	return filepath.Join(runDir, "ctld-"+slot+".sock")
}

// newLogger is `ctld run`'s logger on w per its log flags; lines carry
// their journald priority when w is the journal's stream.
func newLogger(w io.Writer, lf logging.Flags, slot string) (*slog.Logger, error) {
	f, _ := w.(*os.File)
	o, err := lf.Options(logging.UnderJournald(os.Getenv, f))
	if err != nil {
		return nil, err
	}
	return logging.NewWith(w, o).With("slot", slot), nil
}

var errNotRoot = errors.New("must run as root")
