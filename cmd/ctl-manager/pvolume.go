package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/template"
)

// Persistent volumes: block-store volumes of their own (kind volumes),
// each an ext4 file system that `sandbox create --volume ID:/PATH`
// attaches to one sandbox at a time and that outlives it.

// parseVolumeMounts parses the --volume ID:/PATH flags (the claim's
// validation checks IDs and paths).
func parseVolumeMounts(flags []string) ([]api.VolumeMount, error) {
	var out []api.VolumeMount
	for _, f := range flags {
		id, p, ok := strings.Cut(f, ":")
		if !ok || id == "" || p == "" {
			return nil, usageError{fmt.Errorf("--volume %q: want ID:/PATH", f)}
		}
		out = append(out, api.VolumeMount{ID: id, Path: p})
	}
	return out, nil
}

func (c *cli) volumeCommand(getenv func(string) string) *cobra.Command {
	tf := &templateFlags{getenv: getenv}
	g := group("volume", "Create, list and remove persistent volumes (in the block store)")
	tf.register(g.PersistentFlags(), "create makes it")
	c.readsStoreConfig(g)

	var size, tmp string
	create := &cobra.Command{Use: "create ID [--size 1Gi]", Short: "Create a persistent volume: an empty ext4 file system of --size", Args: exactArgs(1, "ID")}
	create.Flags().StringVar(&size, "size", "1Gi", "device size (a multiple of 64Ki)")
	create.Flags().StringVar(&tmp, "tmp-dir", "", "directory for the image while building (default: the store's parent; $TMPDIR for an S3 store)")
	create.RunE = c.action(named("volume create"), func(ctx context.Context, args []string) error {
		n, err := manager.ParseMemory(size)
		if err != nil {
			return usageError{fmt.Errorf("--size: %w", err)}
		}
		if n <= 0 || n%blockstore.DefaultChunkSize != 0 {
			return usageError{fmt.Errorf("--size %s: not a positive multiple of 64Ki", size)}
		}
		if err := blockstore.Vol(args[0]).Check(); err != nil {
			return usageError{err}
		}
		m, done, err := c.manager(ctx, true)
		if err != nil {
			return err
		}
		defer done()
		// The bucket's tombstone may be gone: the manager remembers.
		if _, deleted, err := m.Store.VolumeMark(ctx, args[0]); err != nil {
			return err
		} else if deleted {
			return errdefs.Errorf(errdefs.CodeConflict, "volume %s was deleted; its ID is not reused (pick another)", args[0])
		}
		tf.compress = blockstore.CompressS2
		_, repo, err := tf.open(ctx, true)
		if err != nil {
			return err
		}
		h, err := template.CreateVolume(ctx, repo, args[0], n, tf.tmpDir(tmp))
		if err != nil {
			return err
		}
		if err := m.Store.RaiseVolumeMark(ctx, args[0], api.VolumeHead{Seq: h.Seq, Generation: h.Generation}); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"id": args[0], "device_size": n, "head": h})
		}
		fmt.Fprintf(c.stdout, "volume %s: %s, head %d\n", args[0], manager.FormatMemory(n), h.Seq)
		return nil
	})

	ls := &cobra.Command{Use: "ls", Short: "List the persistent volumes: size and head", Args: noArgs}
	ls.RunE = storeLs(c, tf, "volume ls", template.ListVolumes, "no volumes", "ID\tSIZE\tHEAD\tGENERATION\tBY", func(v template.VolumeInfo) string {
		return fmt.Sprintf("%s\t%s\t%d\t%d\t%s", v.ID, manager.FormatMemory(int64(v.DeviceSize)), v.Head.Seq, v.Head.Generation, v.Head.Node)
	})

	rm := &cobra.Command{Use: "rm ID", Short: "Delete a persistent volume no sandbox has attached (its data goes at the next store gc)", Args: exactArgs(1, "ID")}
	rm.RunE = c.action(named("volume rm"), func(ctx context.Context, args []string) error {
		id := args[0]
		if err := blockstore.Vol(id).Check(); err != nil {
			return usageError{err}
		}
		m, done, err := c.manager(ctx, true)
		if err != nil {
			return err
		}
		defer done()
		// An attached volume's writer would publish over the deleted
		// volume (fenced: its data lost): refuse while any generation
		// that is not released holds it.
		list, err := m.Client.List(ctx)
		if err != nil {
			return fmt.Errorf("ask the node which sandboxes hold volume %s: %w", id, err)
		}
		for _, sb := range list.Sandboxes {
			if sb.State != api.StateReleased && slices.ContainsFunc(sb.Volumes, func(v api.VolumeMount) bool { return v.ID == id }) {
				return errdefs.Errorf(errdefs.CodeConflict, "volume %s is attached to sandbox %s generation %d (%s); release it first", id, sb.ID, sb.Generation, sb.State)
			}
		}
		_, repo, err := tf.open(ctx, false)
		if err != nil {
			return err
		}
		// Remembered first (fail closed): the bucket's tombstone is not
		// trusted to stay, and a volume that comes back is refused.
		if err := m.Store.MarkVolumeDeleted(ctx, id); err != nil {
			return err
		}
		if err := template.RemoveVolume(ctx, repo, id); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "removed volume %s; run store gc to free its data\n", id)
		return nil
	})
	g.AddCommand(create, ls, rm)
	return g
}
