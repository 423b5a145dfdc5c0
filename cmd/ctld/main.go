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
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/node/ha"
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type globalOpts struct {
	stateDir string
	runDir   string
}

func main() {
	var g globalOpts
	root := &cobra.Command{
		Use:           "ctld",
		Short:         "node authority of a gVisor sandbox host",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", "/var/lib/ctld", "state directory shared by slots a and b")
	root.PersistentFlags().StringVar(&g.runDir, "run-dir", "/run/ctld", "runtime directory (sockets, runsc state, bundles)")
	root.AddCommand(runCmd(&g), statusCmd(&g), doctorCmd(&g), versionCmd(), logshimCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "ctld: %v\n", err)
		os.Exit(1)
	}
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		Run:   func(*cobra.Command, []string) { fmt.Println(version) },
	}
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

func statusCmd(g *globalOpts) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status",
		Short: "show the role and epoch of slots a and b",
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
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"slots": rows, "epoch": epoch})
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
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// probeTimeout bounds how long `ctld status` waits for each instance.
const probeTimeout = 2 * time.Second

func probePath(runDir, slot string) string {
	return filepath.Join(runDir, "ctld-"+slot+".sock")
}

func newLogger(slot string) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("slot", slot)
}

var errNotRoot = errors.New("must run as root")
