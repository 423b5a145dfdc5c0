package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/recipe"
)

// defaultRecipeCache is where recipes' trees are kept by digest.
const defaultRecipeCache = "/var/cache/ctld-recipes"

func (c *cli) templateBuildCommand(tf *templateFlags) *cobra.Command {
	var file, cache, tmp, compress, root string
	var treeOnly bool
	cmd := &cobra.Command{
		Use:   "build NAME -f RECIPE.toml",
		Short: "Build a template from a recipe (a Debian suite, packages, files, commands) and store it; an unchanged recipe is not built again",
		Long: "Build a template from a recipe: mmdebstrap makes the tree of a Debian suite with the recipe's packages into a " +
			"directory (the host's own packages are not touched), puts the recipe's files in, runs its commands in the tree's " +
			"chroot, then the tree is imported like a local directory. Trees are cached by the digest of what makes them " +
			"(--cache); the template records its recipe, the digest and its languages (what `code` runs in its sandboxes). " +
			"The same recipe again is up to date; another recipe under an existing name is refused (template rm first). " +
			"Needs root and mmdebstrap, and the recipe's Debian mirror unless the tree is cached.",
		Args: exactArgs(1, "NAME"),
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the recipe (TOML)")
	f.StringVar(&cache, "cache", defaultRecipeCache, "directory of built trees, by digest")
	f.StringVar(&tmp, "tmp-dir", "", "directory for the image while building (default: the store's parent; $TMPDIR for an S3 store)")
	f.StringVar(&compress, "compress", string(blockstore.CompressS2), "compression of the stored chunks: s2, zstd or none")
	registerRoot(f, &root)
	f.BoolVar(&treeOnly, "tree-only", false, "only make sure the recipe's tree is in --cache (built when it is not); store no template")
	cmd.RunE = c.action(named("template build"), func(ctx context.Context, args []string) error {
		if file == "" {
			return usageError{fmt.Errorf("template build needs the recipe: -f RECIPE.toml")}
		}
		src, err := readSource(file, c.stdin)
		if err != nil {
			return err
		}
		r, err := recipe.Parse(src)
		if err != nil {
			return usageError{fmt.Errorf("%s: %w", file, err)}
		}
		size, err := manager.ParseMemory(r.Size)
		if err != nil || size%blockstore.DefaultChunkSize != 0 {
			return usageError{fmt.Errorf("%s: size %q: a multiple of 64Ki", file, r.Size)}
		}
		if tf.compress, err = blockstore.ParseCompression(compress); err != nil {
			return usageError{fmt.Errorf("--compress: %w", err)}
		}
		b := recipe.Builder{CacheDir: cache, Output: c.stderr, Log: c.logger()}
		if treeOnly {
			if r.Base.Template != "" {
				st, _, err := tf.open(ctx, false)
				if err != nil {
					return err
				}
				if r, _, err = recipe.Resolve(ctx, st, r); err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
			}
			root, hit, err := b.Tree(ctx, r)
			if err != nil {
				return err
			}
			how := "built"
			if hit {
				how = "in the cache"
			}
			fmt.Fprintf(c.stdout, "tree of %s (%.12s): %s, %s\n", args[0], r.TreeDigest(), how, root)
			return nil
		}
		if b.Trees, b.TreeOnly, err = tf.rootTrees(root); err != nil {
			return err
		}
		st, repo, err := tf.open(ctx, true)
		if err != nil {
			return err
		}
		start := time.Now()
		out, err := recipe.Build(ctx, st, repo, b, args[0], r, size, tf.tmpDir(tmp), c.progressPrinter())
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"name": args[0], "up_to_date": out.UpToDate, "tree_cached": out.TreeCached,
				"digest": out.Record.Digest, "tree_digest": out.Record.TreeDigest, "languages": out.Record.Languages})
		}
		langs := strings.Join(out.Record.Languages, ", ")
		if langs == "" {
			langs = "none"
		}
		if out.UpToDate {
			fmt.Fprintf(c.stdout, "template %s is up to date: built from this recipe (digest %.12s); languages %s\n", args[0], out.Record.Digest, langs)
			return nil
		}
		for _, s := range out.Image.Skipped {
			fmt.Fprintf(c.stderr, "skipped %s: %s\n", s.Path, s.Reason)
		}
		tree := "tree built"
		if out.TreeCached {
			tree = "tree from the cache"
		}
		if out.Manifest == nil { // --root overlay
			fmt.Fprintf(c.stdout, "template %s: built from recipe %.12s (%s), overlay tree only, %d entries, file data %s; languages %s; %s\n", args[0], out.Record.Digest, tree,
				out.Image.Entries, manager.FormatMemory(out.Image.Bytes), langs, time.Since(start).Round(time.Millisecond))
			return nil
		}
		fmt.Fprintf(c.stdout, "template %s: built from recipe %.12s (%s), %d entries, file data %s, device %s; languages %s; %s\n", args[0], out.Record.Digest, tree,
			out.Image.Entries, manager.FormatMemory(out.Image.Bytes), manager.FormatMemory(int64(out.Manifest.DeviceSize)), langs, time.Since(start).Round(time.Millisecond))
		return nil
	})
	return cmd
}

// recipeLanguages fills in the languages of templates (either root mode)
// that have none from their recipe records in the store (serve's
// templates).
func recipeLanguages(ctx context.Context, st blockstore.Store, tpls []client.Template) error {
	for i := range tpls {
		t := &tpls[i]
		if len(t.Languages) > 0 {
			continue
		}
		rec, ok, err := recipe.ReadRecord(ctx, st, t.Name)
		if err != nil {
			return err
		}
		if ok {
			t.Languages = rec.Languages
		}
	}
	return nil
}
