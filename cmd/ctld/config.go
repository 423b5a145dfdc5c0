package main

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/config"
)

// applyConfig sets cmd's flags from the configuration file at path where
// the command line did not. `ctld run` takes every key (each is one of its
// flags; anything else is an error); status, doctor and key take only the
// directories, so they find what run made, and doctor the runsc settings. The per-process helpers the
// primary starts (writer, logshim) get everything on their command line.
func applyConfig(cmd *cobra.Command, path string) error {
	var keys map[string]string
	switch strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ") {
	case "run":
	case "status", "key rotate":
		keys = map[string]string{"state-dir": "state-dir", "run-dir": "run-dir"}
	case "doctor":
		// and the runsc settings, whose build and platform it reports.
		keys = map[string]string{"state-dir": "state-dir", "run-dir": "run-dir", "runsc": "runsc", "runsc-platform": "runsc-platform"}
	default:
		return nil
	}
	f, err := config.Read(path, cmd.Flags().Changed("config"))
	if err != nil {
		return err
	}
	if keys == nil {
		return f.Apply(cmd.Flags())
	}
	return f.ApplyKeys(cmd.Flags(), keys)
}

// configFlags is every setting of the configuration file: the global
// directories and the flags of `ctld run`.
func configFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("ctld.toml", pflag.ContinueOnError)
	fs.SortFlags = false
	globalFlags(fs, &globalOpts{})
	fs.AddFlagSet(runCmd(&globalOpts{}).Flags())
	return fs
}

const configHeader = `ctld configuration (` + config.DefaultPath + `, or ctld --config PATH).
Each setting is a flag of ` + "`ctld run`" + ` without its dashes; a flag on the
command line wins over the file. Secrets (S3 credentials) do not belong
here: put them in /etc/ctld/ctld.env (the units' EnvironmentFile).
Every setting below is commented out at its default.`

func configCmd() *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "the configuration file"}
	c.AddCommand(&cobra.Command{
		Use:   "default",
		Short: "print a commented configuration file with every setting at its default",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return config.WriteDefault(cmd.OutOrStdout(), configHeader, configFlags())
		},
	})
	return c
}
