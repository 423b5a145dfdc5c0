package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/manager"
)

// version is set at build time with -ldflags "-X main.version=..." (the
// Makefile's git describe); else it comes from the build info.
var version = ""

// buildVersion is the version to print: the linked one, or the module's
// version and VCS revision of `go build`/`go install`.
func buildVersion(linked string, bi *debug.BuildInfo, ok bool) string {
	if linked != "" {
		return linked
	}
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return "devel-" + rev + dirty
	}
	if v == "" {
		return "(devel)"
	}
	return v
}

func (c *cli) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print ctl-manager's version",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			bi, ok := debug.ReadBuildInfo()
			_, err := fmt.Fprintln(c.stdout, buildVersion(version, bi, ok))
			return err
		},
	}
}

// completeSandboxIDs makes every command under root whose first argument
// is an existing sandbox's ID (its Use reads "name ID ...") complete it
// from the manager's store; create takes a new ID and is left alone.
func (c *cli) completeSandboxIDs(cmds ...*cobra.Command) {
	for _, cmd := range cmds {
		c.completeSandboxIDs(cmd.Commands()...)
		f := strings.Fields(cmd.Use)
		if len(f) < 2 || f[1] != "ID" || cmd.Name() == "create" {
			continue
		}
		cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveDefault // later args: paths and such
			}
			ids, err := c.sandboxIDs(cmd.Context(), prefix)
			if err != nil {
				cobra.CompDebugln("sandbox ids: "+err.Error(), true)
				return nil, cobra.ShellCompDirectiveError
			}
			return ids, cobra.ShellCompDirectiveNoFileComp
		}
	}
}

// sandboxIDs are the store's sandbox IDs starting with prefix; a missing
// database has none (completion never creates it).
func (c *cli) sandboxIDs(ctx context.Context, prefix string) ([]string, error) {
	if _, err := os.Stat(c.db); !manager.IsPostgresURL(c.db) && errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	st, err := manager.Open(ctx, c.db, nil)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	sbs, err := st.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range sbs {
		if strings.HasPrefix(s.ID, prefix) {
			ids = append(ids, s.ID)
		}
	}
	return ids, nil
}
