package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ctld/ctld/internal/blockstore"
	"golang.org/x/sys/unix"
)

var (
	// ErrTemplateExists: a template of that name is in the store already
	// (templates are immutable; remove it first).
	ErrTemplateExists = errors.New("template exists")
	// ErrTemplateNotFound: no template of that name.
	ErrTemplateNotFound = errors.New("template not found")
	// ErrTemplateInUse: a sandbox generation is built over the template.
	ErrTemplateInUse = errors.New("template in use")
	// ErrNoTrees: only an overlay tree was asked for, with no templates
	// directory to keep it in.
	ErrNoTrees = errors.New("an overlay-only template needs ctld's templates directory")
)

// Import stores the image file at image as generation 0 of the template
// volume name: only the chunks holding data are read (SEEK_DATA) and
// uploaded, all-zero chunks stay holes. The size must be a multiple of the
// chunk size. Nothing is visible until the manifest is written last; on an
// error the template does not exist (at most unreferenced chunk objects,
// which Remove deletes).
func Import(ctx context.Context, repo *blockstore.Repo, name, image string, progress func(Progress)) (*blockstore.Manifest, error) {
	vol := blockstore.Template(name)
	if err := vol.Check(); err != nil {
		return nil, fmt.Errorf("import template %q: %w", name, err)
	}
	m, err := importImage(ctx, repo, vol, image, progress, nil)
	if errors.Is(err, blockstore.ErrExists) {
		return nil, fmt.Errorf("import template %s: %w", name, ErrTemplateExists)
	}
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	return m, nil
}

// importChecked is Import of a transient image that BuildImage left
// unchecked: e2fsck runs while it uploads.
func importChecked(ctx context.Context, repo *blockstore.Repo, name, image string, progress func(Progress)) (*blockstore.Manifest, error) {
	vol := blockstore.Template(name)
	m, err := importImage(ctx, repo, vol, image, progress, func(ctx context.Context) error { return checkImage(ctx, image) })
	if errors.Is(err, blockstore.ErrExists) {
		return nil, fmt.Errorf("import template %s: %w", name, ErrTemplateExists)
	}
	if err != nil {
		return nil, fmt.Errorf("import template %s: %w", name, err)
	}
	return m, nil
}

// importImage stores the image file at image as generation 0 of vol (an
// error wrapping blockstore.ErrExists if it has one). A non-nil check
// runs while the chunks upload: an error from it stops the import before
// the manifest is written (the image checked while it is stored).
func importImage(ctx context.Context, repo *blockstore.Repo, vol blockstore.Volume, image string, progress func(Progress), check func(context.Context) error) (*blockstore.Manifest, error) {
	name := vol.String()
	f, err := os.Open(image)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	const cs = blockstore.DefaultChunkSize
	size := fi.Size()
	if !fi.Mode().IsRegular() || size <= 0 || size%cs != 0 {
		return nil, fmt.Errorf("import %s: image %s of %d bytes is not a regular file of a positive multiple of %d bytes", name, image, size, cs)
	}
	// Packed: a template's chunks all live as long as it does, so they
	// go into pack objects, one durable write per pack (pack.go).
	w, err := repo.NewWriter(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: vol}, DeviceSize: uint64(size), ChunkSize: cs, Packed: true})
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	committed := false
	defer func() {
		if !committed {
			w.Abort()
		}
	}()
	checked := make(chan error, 1)
	if check != nil {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { checked <- check(cctx) }()
	} else {
		checked <- nil
	}
	buf := make([]byte, cs)
	var chunks int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off to the end
		}
		if err != nil {
			return nil, fmt.Errorf("import %s: seek data: %w", name, err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("import %s: seek hole: %w", name, err)
		}
		for c := data / cs * cs; c < hole; c += cs {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("import %s: %w", name, err)
			}
			if _, err := f.ReadAt(buf, c); err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("import %s: read %s: %w", name, image, err)
			}
			if err := w.WriteChunk(ctx, uint64(c/cs), buf); err != nil {
				return nil, fmt.Errorf("import %s: %w", name, err)
			}
			chunks++
			if progress != nil {
				progress(Progress{Phase: "upload", Entries: chunks, Bytes: c + cs})
			}
		}
		off = (hole + cs - 1) / cs * cs
	}
	if err := <-checked; err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	m, err := w.Commit(ctx)
	committed = true
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	if progress != nil {
		progress(Progress{Phase: "stored", Entries: chunks, Bytes: size})
	}
	return m, nil
}

// ImportSource builds src into an ext4 image (in tmpDir, removed after) and
// imports it as template name; with o.Trees, the tree stays as the
// template's overlay lower too. With o.TreeOnly only the tree is made
// (unpacked with the same checks and bounds) and the manifest is nil.
func ImportSource(ctx context.Context, repo *blockstore.Repo, name string, src Source, o ImageOptions, tmpDir string) (*blockstore.Manifest, ImageResult, error) {
	if err := blockstore.Template(name).Check(); err != nil {
		return nil, ImageResult{}, fmt.Errorf("import template %q: %w", name, err)
	}
	if o.TreeOnly && o.Trees.Dir == "" {
		return nil, ImageResult{}, fmt.Errorf("import template %s: %w", name, ErrNoTrees)
	}
	// Refuse before the (long) build, not only at the commit.
	if gens, err := repo.Generations(ctx, blockstore.Template(name)); err != nil {
		return nil, ImageResult{}, fmt.Errorf("import template %s: %w", name, err)
	} else if len(gens) > 0 {
		return nil, ImageResult{}, fmt.Errorf("import template %s: %w", name, ErrTemplateExists)
	}
	var err error
	if o.tree, err = o.Trees.begin(name); err != nil {
		return nil, ImageResult{}, fmt.Errorf("import template %s: %w", name, err)
	}
	defer o.Trees.drop(o.tree) // gone once published
	dir, err := os.MkdirTemp(tmpDir, "template-import-")
	if err != nil {
		return nil, ImageResult{}, fmt.Errorf("import template %s: %w", name, err)
	}
	defer os.RemoveAll(dir)
	img := filepath.Join(dir, "root.ext4")
	o.transient, o.noImage = true, o.TreeOnly
	res, err := BuildImage(ctx, src, img, o)
	if err != nil {
		return nil, res, err
	}
	if o.TreeOnly {
		if err := o.Trees.publish(o.tree, name); err != nil {
			return nil, res, fmt.Errorf("import template %s: %w", name, err)
		}
		return nil, res, nil
	}
	m, err := importChecked(ctx, repo, name, img, o.Progress)
	if err != nil {
		return nil, res, err
	}
	return m, res, o.Trees.publishImported(o.tree, name)
}

// Info is one template of a store.
type Info struct {
	Name       string
	DeviceSize uint64
	ChunkSize  uint32
	DataChunks int    // chunks stored (the others are zeros)
	Image      string `json:",omitempty"` // REF@DIGEST of a registry import
	// Root is "overlay" for a template with only an overlay tree (no
	// block image: the sizes are zero); "" for one with a block image.
	Root string `json:",omitempty"`
}

// List returns the templates of the store, by name. A volume with objects
// but no generation 0 (an import that did not finish) is left out.
func List(ctx context.Context, store blockstore.Store, repo *blockstore.Repo) ([]Info, error) {
	keys, err := store.List(ctx, string(blockstore.KindTemplate)+"/")
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Info
	for _, k := range keys {
		v, rest, ok := strings.Cut(strings.TrimPrefix(k, string(blockstore.KindTemplate)+"/"), "/")
		if !ok || rest != fmt.Sprintf("gen/%020d", 0) {
			continue
		}
		m, err := repo.Manifest(ctx, blockstore.GenRef{Volume: blockstore.Template(v)})
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		info := Info{Name: v, DeviceSize: m.DeviceSize, ChunkSize: m.ChunkSize, DataChunks: len(m.Entries)}
		if m.Parent != nil { // a fork of a registry image's base
			p, err := repo.Manifest(ctx, *m.Parent)
			if err != nil {
				return nil, fmt.Errorf("list templates: %w", err)
			}
			info.DataChunks = len(p.Entries)
		}
		if meta, ok, err := ReadMeta(ctx, repo, v); err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		} else if ok && meta.Source == sourceBase {
			continue // not a template of its own: its forks are
		} else if ok {
			info.Image = meta.Ref + "@" + meta.Digest
			if strings.Contains(meta.Ref, "@") {
				info.Image = meta.Ref // pinned: the digest is in it
			}
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Remove deletes template name: refused while any sandbox generation has
// it as parent; the manifest goes first (from then on the template does
// not exist), then its chunks and its key. Removing what a crashed import
// or remove left is allowed; a name with no object at all is
// ErrTemplateNotFound.
func Remove(ctx context.Context, store blockstore.Store, repo *blockstore.Repo, name string) error {
	vol := blockstore.Template(name)
	if err := vol.Check(); err != nil {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	keys, err := store.List(ctx, vol.String()+"/")
	if err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	if len(keys) == 0 {
		return fmt.Errorf("remove template %s: %w", name, ErrTemplateNotFound)
	}
	// A sandbox generation, or a template that is a fork of this one (a
	// registry image's base).
	var users []string
	for _, kind := range []blockstore.VolumeKind{blockstore.KindSandbox, blockstore.KindTemplate} {
		ks, err := store.List(ctx, string(kind)+"/")
		if err != nil {
			return fmt.Errorf("remove template %s: %w", name, err)
		}
		users = append(users, ks...)
	}
	for _, k := range users {
		kind, k, _ := strings.Cut(k, "/")
		v, rest, ok := strings.Cut(k, "/")
		if !ok || !strings.HasPrefix(rest, "gen/") || (kind == string(blockstore.KindTemplate) && v == name) {
			continue
		}
		var g uint64
		if _, err := fmt.Sscanf(strings.TrimPrefix(rest, "gen/"), "%d", &g); err != nil {
			continue
		}
		ref := blockstore.GenRef{Volume: blockstore.Volume{Kind: blockstore.VolumeKind(kind), ID: v}, Generation: g}
		m, err := repo.Manifest(ctx, ref)
		if err != nil {
			// Fail closed: a manifest we cannot read might be a user.
			return fmt.Errorf("remove template %s: check %s: %w", name, ref, err)
		}
		if m.Parent != nil && m.Parent.Volume == vol {
			return fmt.Errorf("remove template %s: %w by %s", name, ErrTemplateInUse, ref)
		}
	}
	// Manifests, then chunks, then the key: a crash midway leaves a
	// template that List no longer shows and that Remove finishes.
	rank := func(k string) int {
		switch {
		case strings.Contains(k, "/gen/"):
			return 0
		case strings.HasSuffix(k, "/key"):
			return 2
		}
		return 1
	}
	slices.SortStableFunc(keys, func(a, b string) int { return rank(a) - rank(b) })
	for _, k := range keys {
		if err := store.Delete(ctx, k); err != nil {
			return fmt.Errorf("remove template %s: %w", name, err)
		}
	}
	return nil
}
