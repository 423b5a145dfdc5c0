package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/template"
)

// templateFlags locate the block store the template commands work on: for
// now the local directory store and the node key beside it.
type templateFlags struct {
	store   string
	s3      storecfg.Config
	keyFile string
	keyID   string
	getenv  func(string) string // the S3 credentials' environment
	// compress: what an import compresses its chunks with (--compress);
	// "" (none) for the commands that only read and delete. Reads take
	// what each object says.
	compress blockstore.Compression
	// templates is ctld's overlay templates directory (--templates-dir);
	// "" is the one beside a local store. See trees.
	templates string
}

// register adds the block store's flags (template and volume commands);
// creates says which command makes a missing node key.
func (tf *templateFlags) register(pf *pflag.FlagSet, creates string) {
	pf.StringVar(&tf.store, "store", "/var/lib/ctld/blockstore", "block store: a directory or s3://BUCKET[/PREFIX]")
	tf.s3.Flags(pf)
	pf.StringVar(&tf.keyFile, "node-key", "/var/lib/ctld/blockstore.key", "node key file (64 hex digits; "+creates+", mode 0600, if missing)")
	pf.StringVar(&tf.keyID, "node-key-id", "node", "node key ID")
}

// registerTrees adds --templates-dir (the commands that make or remove
// templates).
func (tf *templateFlags) registerTrees(pf *pflag.FlagSet) {
	pf.StringVar(&tf.templates, "templates-dir", "", "ctld's overlay templates directory, where an import keeps the template's tree for overlay mode "+
		"(default: ctld's, the state dir's templates beside the store, when it exists; none to keep no tree)")
}

// registerRoot adds --root (import, build) to root.
func registerRoot(pf *pflag.FlagSet, root *string) {
	pf.StringVar(root, "root", "both", "the root modes the template serves: both (a block image and the overlay tree), block (no tree), "+
		"or overlay (only the tree in ctld's templates directory: no block image is built or stored, much faster)")
}

// rootTrees reads --root (see registerRoot): where the tree is kept and
// whether it is all that is made.
func (tf *templateFlags) rootTrees(root string) (trees template.Trees, treeOnly bool, err error) {
	switch root {
	case "both":
		trees, err = tf.trees()
		return trees, false, err
	case "block":
		if tf.templates != "" && tf.templates != "none" {
			return template.Trees{}, false, usageError{errors.New("--root block keeps no overlay tree: --templates-dir is for the other root modes")}
		}
		return template.Trees{}, false, nil
	case "overlay":
		if trees, err = tf.trees(); err != nil {
			return trees, false, err
		}
		if trees.Dir == "" {
			return trees, false, usageError{errors.New("--root overlay keeps only the template's tree, in ctld's templates directory: none found (--templates-dir DIR)")}
		}
		return trees, true, nil
	}
	return template.Trees{}, false, usageError{fmt.Errorf("--root %q: want both, block or overlay", root)}
}

// trees is where imports keep overlay trees: --templates-dir (none: no
// tree), else ctld's templates directory beside a local store (the state
// dir's), or from ctld's config for an S3 store, when it exists: a host
// without ctld keeps no tree.
func (tf *templateFlags) trees() (template.Trees, error) {
	dir, explicit := tf.templates, tf.templates != ""
	switch {
	case dir == "none":
		return template.Trees{}, nil
	case dir == "" && !strings.HasPrefix(tf.store, "s3://"):
		dir = filepath.Join(filepath.Dir(filepath.Clean(tf.store)), "templates")
	}
	if dir == "" {
		return template.Trees{}, nil
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if explicit {
			return template.Trees{}, usageError{fmt.Errorf("--templates-dir %s: not a directory", dir)}
		}
		return template.Trees{}, nil
	}
	return template.Trees{Dir: dir}, nil
}

// tmpDir is the build directory: tmp (--tmp-dir) if set, else the
// store's parent, or $TMPDIR for an S3 store (it has no local parent).
func (tf *templateFlags) tmpDir(tmp string) string {
	if tmp != "" {
		return tmp
	}
	if strings.HasPrefix(tf.store, "s3://") {
		return os.TempDir()
	}
	return filepath.Dir(filepath.Clean(tf.store))
}

func (c *cli) templateCommand(getenv func(string) string) *cobra.Command {
	tf := &templateFlags{getenv: getenv}
	g := group("template", "Import, list and remove block-mode RootFS templates (in the local block store)")
	tf.register(g.PersistentFlags(), "import creates it")
	c.readsStoreConfig(g)
	imp, rm, build := c.templateImportCommand(tf), c.templateRmCommand(tf), c.templateBuildCommand(tf)
	for _, cmd := range []*cobra.Command{imp, rm, build} {
		tf.registerTrees(cmd.Flags())
	}
	g.AddCommand(imp, c.templateLsCommand(tf), rm, build, c.templatePruneCommand(tf))
	return g
}

// open returns the store and repo; create says a missing node key may be
// made (import), otherwise it is an error.
func (tf *templateFlags) open(ctx context.Context, create bool) (blockstore.Store, *blockstore.Repo, error) {
	load := blockstore.LoadNodeKeyFile
	if create {
		load = blockstore.LoadOrCreateNodeKeyFile
	}
	nk, err := load(tf.keyFile, tf.keyID)
	if err != nil {
		return nil, nil, err
	}
	sc := tf.s3
	sc.Location = tf.store
	st, err := sc.Open(ctx, create, tf.getenv)
	if err != nil {
		return nil, nil, err
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{Compression: tf.compress})
	if err != nil {
		return nil, nil, err
	}
	return st, repo, nil
}

func (c *cli) templateImportCommand(tf *templateFlags) *cobra.Command {
	var size, kind, tmp, compress, image, platform, layerCache, root string
	cmd := &cobra.Command{
		Use:   "import NAME {SOURCE | --image REF}",
		Short: "Build an ext4 image from a registry image, a directory, tarball, docker-archive, OCI layout or oci-archive and store it as a template",
		Args: func(cmd *cobra.Command, args []string) error {
			if image != "" {
				return exactArgs(1, "NAME (with --image)")(cmd, args)
			}
			return exactArgs(2, "NAME SOURCE")(cmd, args)
		},
	}
	cmd.Flags().StringVar(&size, "size", "1Gi", "device size of the image (a multiple of 64Ki); also bounds the layers' compressed bytes of --image")
	cmd.Flags().StringVar(&kind, "kind", "", "source kind: dir, tar, docker-archive, oci, oci-archive (default: detect)")
	cmd.Flags().StringVar(&image, "image", "", "pull REF (registry/repo:tag or repo@sha256:...) from its registry instead of reading SOURCE; credentials from the docker config file ($DOCKER_CONFIG, ~/.docker/config.json) and its credential helpers")
	cmd.Flags().StringVar(&platform, "platform", "", "platform to pick from a multi-platform --image (default linux/<this machine's architecture>)")
	cmd.Flags().StringVar(&layerCache, "layer-cache", "", "directory of --image layers by digest, shared by imports (default: layercache beside the store; under $TMPDIR for an S3 store)")
	cmd.Flags().StringVar(&compress, "compress", string(blockstore.CompressS2), "compression of the stored chunks: s2 (fast reads), zstd (the smallest store, reads that cost more CPU) or none (the largest store, the cheapest reads)")
	cmd.Flags().StringVar(&tmp, "tmp-dir", "", "directory for the unpacked tree and the image while building (default: the store's parent; $TMPDIR for an S3 store)")
	registerRoot(cmd.Flags(), &root)
	cmd.RunE = c.action(named("template import"), func(ctx context.Context, args []string) error {
		n, err := manager.ParseMemory(size)
		if err != nil {
			return usageError{err}
		}
		if n%blockstore.DefaultChunkSize != 0 {
			return usageError{fmt.Errorf("--size %s: not a multiple of 64Ki", size)}
		}
		if tf.compress, err = blockstore.ParseCompression(compress); err != nil {
			return usageError{fmt.Errorf("--compress: %w", err)}
		}
		var plat v1.Platform
		if platform != "" {
			p, err := v1.ParsePlatform(platform)
			if err != nil {
				return usageError{fmt.Errorf("--platform: %w", err)}
			}
			plat = *p
		}
		trees, treeOnly, err := tf.rootTrees(root)
		if err != nil {
			return err
		}
		if treeOnly && image != "" {
			// The image's config (a claim's defaults) is kept sealed
			// beside its block image.
			return usageError{errors.New("--root overlay is for local sources and recipes: an --image import keeps its config beside the block image")}
		}
		_, repo, err := tf.open(ctx, true)
		if err != nil {
			return err
		}
		start := time.Now()
		opts := template.ImageOptions{Size: n, Progress: c.progressPrinter(), Trees: trees, TreeOnly: treeOnly}
		if image != "" {
			if layerCache == "" {
				layerCache = tf.layerCache()
			}
			po := template.PullOptions{CacheDir: layerCache, Platform: plat, MaxBytes: n, Progress: c.pullProgress()}
			m, res, meta, err := template.ImportImage(ctx, repo, args[0], image, po, opts, tf.tmpDir(tmp))
			if err != nil {
				return err
			}
			for _, s := range res.Skipped {
				fmt.Fprintf(c.stderr, "skipped %s: %s\n", s.Path, s.Reason)
			}
			if c.json {
				return c.printJSON(map[string]any{"name": args[0], "device_size": m.DeviceSize, "chunk_size": m.ChunkSize,
					"data_chunks": len(m.Entries), "entries": res.Entries, "bytes": res.Bytes, "skipped": len(res.Skipped), "image": meta})
			}
			stored := fmt.Sprintf("%d data chunks stored", len(m.Entries))
			if res.Base != "" {
				stored = "image " + res.Base
				if res.Reused {
					stored += " (stored before: nothing built)"
				}
			}
			fmt.Fprintf(c.stdout, "template %s: image %s (%s, %s), %d entries, file data %s, device %s, %s, %s\n", args[0], image, meta.Digest, meta.Platform,
				res.Entries, manager.FormatMemory(res.Bytes), manager.FormatMemory(int64(m.DeviceSize)), stored, time.Since(start).Round(time.Millisecond))
			return nil
		}
		m, res, err := template.ImportSource(ctx, repo, args[0], template.Source{Kind: template.Kind(kind), Path: args[1]}, opts, tf.tmpDir(tmp))
		if err != nil {
			return err
		}
		for _, s := range res.Skipped {
			fmt.Fprintf(c.stderr, "skipped %s: %s\n", s.Path, s.Reason)
		}
		if treeOnly {
			if c.json {
				return c.printJSON(map[string]any{"name": args[0], "root": "overlay", "entries": res.Entries, "bytes": res.Bytes, "skipped": len(res.Skipped)})
			}
			fmt.Fprintf(c.stdout, "template %s: overlay tree only, %d entries, file data %s, %s\n", args[0], res.Entries,
				manager.FormatMemory(res.Bytes), time.Since(start).Round(time.Millisecond))
			return nil
		}
		if c.json {
			return c.printJSON(map[string]any{"name": args[0], "device_size": m.DeviceSize, "chunk_size": m.ChunkSize,
				"data_chunks": len(m.Entries), "entries": res.Entries, "bytes": res.Bytes, "skipped": len(res.Skipped)})
		}
		fmt.Fprintf(c.stdout, "template %s: %d entries, file data %s, device %s, %d data chunks stored, %s\n", args[0], res.Entries,
			manager.FormatMemory(res.Bytes), manager.FormatMemory(int64(m.DeviceSize)), len(m.Entries), time.Since(start).Round(time.Millisecond))
		return nil
	})
	return cmd
}

// layerCache is the default layer cache: layercache beside the store
// (under $TMPDIR for an S3 store).
func (tf *templateFlags) layerCache() string { return filepath.Join(tf.tmpDir(""), "layercache") }

func (c *cli) templatePruneCommand(tf *templateFlags) *cobra.Command {
	var layerCache string
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove the layers of the layer cache that no template of the store uses (waits for imports in flight)",
		Args:  noArgs,
	}
	cmd.Flags().StringVar(&layerCache, "layer-cache", "", "the layer cache (default: layercache beside the store; under $TMPDIR for an S3 store)")
	cmd.RunE = c.action(fixed("template prune"), func(ctx context.Context, _ []string) error {
		st, repo, err := tf.open(ctx, false)
		if err != nil {
			return err
		}
		res, err := template.Prune(ctx, st, repo, cmp.Or(layerCache, tf.layerCache()))
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"removed": res.Removed, "bytes": res.Bytes, "kept": res.Kept, "images": res.Images})
		}
		fmt.Fprintf(c.stdout, "pruned %d layers (%s), kept %d\n", res.Removed, manager.FormatMemory(res.Bytes), res.Kept)
		if res.Images > 0 {
			fmt.Fprintf(c.stdout, "removed %d stored images of layers no template uses\n", res.Images)
		}
		return nil
	})
	return cmd
}

// progressPrinter reports an import on stderr: each phase as it starts and
// the counts at most once a second within it.
func (c *cli) progressPrinter() func(template.Progress) {
	var phase string
	var last time.Time
	return func(p template.Progress) {
		if p.Phase == phase && time.Since(last) < time.Second {
			return
		}
		phase, last = p.Phase, time.Now()
		unit := "entries"
		if p.Phase == "upload" || p.Phase == "stored" {
			unit = "chunks"
		}
		fmt.Fprintf(c.stderr, "%s: %d %s, %s\n", p.Phase, p.Entries, unit, manager.FormatMemory(p.Bytes))
	}
}

func (c *cli) templateLsCommand(tf *templateFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "ls", Short: "List the templates of the block store (and those with only an overlay tree in ctld's templates directory)", Args: noArgs}
	tf.registerTrees(cmd.Flags())
	list := func(ctx context.Context, st blockstore.Store, repo *blockstore.Repo) ([]template.Info, error) {
		out, err := template.List(ctx, st, repo)
		if err != nil {
			return nil, err
		}
		trees, err := tf.trees()
		if err != nil {
			return nil, err
		}
		names, err := trees.Names()
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if !slices.ContainsFunc(out, func(i template.Info) bool { return i.Name == n }) {
				out = append(out, template.Info{Name: n, Root: "overlay"})
			}
		}
		slices.SortFunc(out, func(a, b template.Info) int { return strings.Compare(a.Name, b.Name) })
		return out, nil
	}
	cmd.RunE = storeLs(c, tf, "template ls", list, "no templates", "NAME\tSIZE\tDATA CHUNKS\tIMAGE", func(i template.Info) string {
		if i.Root == "overlay" {
			return fmt.Sprintf("%s\t-\t-\t(overlay tree only)", i.Name)
		}
		return fmt.Sprintf("%s\t%s\t%d\t%s", i.Name, manager.FormatMemory(int64(i.DeviceSize)), i.DataChunks, cmp.Or(i.Image, "-"))
	})
	return cmd
}

// storeLs is the action of a block-store listing (`template ls`, `volume
// ls`): list's items, with --json as they are (an empty list, not null),
// else none when there are none, else a table of header and a row(item)
// line each.
func storeLs[T any](c *cli, tf *templateFlags, name string, list func(context.Context, blockstore.Store, *blockstore.Repo) ([]T, error),
	none, header string, row func(T) string) func(*cobra.Command, []string) error {
	return c.action(fixed(name), func(ctx context.Context, _ []string) error {
		st, repo, err := tf.open(ctx, false)
		if err != nil {
			return err
		}
		items, err := list(ctx, st, repo)
		if err != nil {
			return err
		}
		if c.json {
			if items == nil {
				items = []T{}
			}
			return c.printJSON(items)
		}
		if len(items) == 0 {
			fmt.Fprintln(c.stdout, none)
			return nil
		}
		w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, header)
		for _, it := range items {
			fmt.Fprintln(w, row(it))
		}
		return w.Flush()
	})
}

func (c *cli) templateRmCommand(tf *templateFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "rm NAME", Short: "Remove a template no sandbox generation is built over", Args: exactArgs(1, "NAME")}
	cmd.RunE = c.action(named("template rm"), func(ctx context.Context, args []string) error {
		trees, err := tf.trees()
		if err != nil {
			return err
		}
		st, repo, err := tf.open(ctx, false)
		if err != nil {
			return err
		}
		if err := trees.RemoveTemplate(ctx, st, repo, args[0]); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "removed template %s\n", args[0])
		return nil
	})
	return cmd
}
