package main

import (
	"encoding/hex"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/proof"
	"github.com/spf13/cobra"
)

// keyCmd rotates the node's proof key (docs/operations.md, "Security
// model"): the managers that pinned the old key follow the record the old
// key signs; both instances sign with the new key from their next start.
func keyCmd(g *globalOpts) *cobra.Command {
	c := &cobra.Command{Use: "key", Short: "manage the node's proof key"}
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "give the node a new proof key, signed over by the current one (restart ctld@a and ctld@b to use it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := proof.RotateIdentity(g.stateDir, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s: proof key %s replaces %s; restart the standby, then the primary\n",
				r.NodeID, hex.EncodeToString(r.NewKey), hex.EncodeToString(r.OldKey))
			return nil
		},
	}
	c.AddCommand(rotate)
	return c
}
