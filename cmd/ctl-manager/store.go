package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
)

// The block store's housekeeping: store gc frees what no head, snapshot,
// template or fork reaches; store forget deletes a sandbox's volume (its
// heads and snapshots) so the next gc can free its data.

func (c *cli) storeCommand(getenv func(string) string) *cobra.Command {
	tf := &templateFlags{getenv: getenv}
	g := group("store", "Collect garbage in the block store, forget a sandbox's volume")
	pf := g.PersistentFlags()
	pf.StringVar(&tf.store, "store", "/var/lib/ctld/blockstore", "block store: a directory or s3://BUCKET[/PREFIX]")
	tf.s3.Flags(pf)
	pf.StringVar(&tf.keyFile, "node-key", "/var/lib/ctld/blockstore.key", "node key file (64 hex digits)")
	pf.StringVar(&tf.keyID, "node-key-id", "node", "node key ID")
	c.readsStoreConfig(g)

	var dry bool
	var grace time.Duration
	gc := &cobra.Command{Use: "gc [--dry-run] [--grace 1h]", Short: "Delete the objects no head, snapshot, template or fork reaches (older than --grace)", Args: noArgs}
	gc.Flags().BoolVar(&dry, "dry-run", false, "delete nothing; list what would go")
	gc.Flags().DurationVar(&grace, "grace", time.Hour, "keep every object younger than this (seals and forks in flight)")
	gc.RunE = c.action(fixed("store gc"), func(ctx context.Context, _ []string) error {
		if grace <= 0 {
			return usageError{fmt.Errorf("--grace must be positive, got %v", grace)}
		}
		_, repo, err := tf.open(ctx, false)
		if err != nil {
			return err
		}
		rep, err := repo.GC(ctx, blockstore.GCOptions{Grace: grace, DryRun: dry})
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(rep)
		}
		verb := "deleted"
		if dry {
			verb = "would delete"
			for _, k := range rep.DeletedKeys {
				fmt.Fprintln(c.stdout, k)
			}
		}
		fmt.Fprintf(c.stdout, "gc %s %s (%d bytes); kept %s\n", verb, counts(rep.Deleted), rep.BytesFreed, counts(rep.Kept))
		return nil
	})

	forget := &cobra.Command{Use: "forget ID", Short: "Delete a sandbox's volume (heads and snapshots; data goes at the next gc unless a fork shares it)", Args: exactArgs(1, "ID")}
	forget.RunE = c.action(named("store forget"), func(ctx context.Context, args []string) error {
		id := args[0]
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		// A running generation would publish over a deleted volume: refuse.
		if sb, err := m.Client.Get(ctx, id); err == nil && (sb.State == api.StateReady || sb.State == api.StateClaiming || sb.State == api.StateReleasing) {
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d is %s; release or pause it first", id, sb.Generation, sb.State)
		} else if err != nil && errdefs.CodeOf(err) != errdefs.CodeNotFound {
			return fmt.Errorf("ask the node about %s: %w", id, err)
		}
		vol := blockstore.Sandbox(id)
		if err := vol.Check(); err != nil {
			return usageError{err}
		}
		_, repo, err := tf.open(ctx, false)
		if err != nil {
			return err
		}
		if err := repo.DeleteVolume(ctx, vol); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "forgot %s: its heads and snapshots are gone; run store gc to free its data\n", vol)
		return nil
	})
	g.AddCommand(gc, forget)
	return g
}

// counts prints a by-kind count map in a stable order.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "nothing"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
