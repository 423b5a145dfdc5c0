package main

import (
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/config"
)

// readsStoreConfig makes the block store commands under g (template,
// volume, store) take the block store's settings from ctld's
// configuration file, so they are not repeated as flags: --store from
// block-store (default <state-dir>/blockstore, as ctld), --node-key from
// node-key (default <state-dir>/blockstore.key), and the S3 settings and
// node key ID as named. A flag on the command line still wins; the file's
// other keys are ctld's and ignored here.
func (c *cli) readsStoreConfig(g *cobra.Command) {
	g.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return c.applyStoreConfig(cmd.Flags())
	}
}

func (c *cli) applyStoreConfig(fs *pflag.FlagSet) error {
	f, err := config.Read(c.config, fs.Changed("config"))
	if err != nil {
		return err
	}
	// ctld's view of the settings: its flags and defaults.
	var (
		nodeFS                      = pflag.NewFlagSet("ctld", pflag.ContinueOnError)
		s3                          storecfg.Config
		stateDir, store, key, keyID string
	)
	nodeFS.StringVar(&stateDir, "state-dir", "/var/lib/ctld", "")
	nodeFS.StringVar(&store, "block-store", "", "")
	nodeFS.StringVar(&key, "node-key", "", "")
	nodeFS.StringVar(&keyID, "node-key-id", "node", "")
	s3.Flags(nodeFS)
	keys := map[string]string{}
	nodeFS.VisitAll(func(fl *pflag.Flag) { keys[fl.Name] = fl.Name })
	if err := f.ApplyKeys(nodeFS, keys); err != nil {
		return err
	}
	if store == "" {
		store = filepath.Join(stateDir, "blockstore")
	}
	if key == "" {
		key = filepath.Join(stateDir, "blockstore.key")
	}
	mine := map[string]string{"store": store, "node-key": key, "node-key-id": keyID}
	if strings.HasPrefix(store, "s3://") {
		mine["templates-dir"] = filepath.Join(stateDir, "templates") // no local store beside it
	}
	for _, n := range []string{"s3-endpoint", "s3-region", "s3-virtual-hosted", "s3-credentials-file"} {
		mine[n] = nodeFS.Lookup(n).Value.String()
	}
	for name, v := range mine {
		fl := fs.Lookup(name)
		if fl == nil || fl.Changed {
			continue
		}
		if err := fl.Value.Set(v); err != nil {
			return err
		}
	}
	return nil
}
