package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
)

// lockCache takes the layer cache's lock file (made once, never removed,
// so every holder locks the same inode): shared by imports, from before
// they look for a layer until their template records it; exclusive by
// Prune. The returned func releases it.
func lockCache(ctx context.Context, dir string, how int) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create layer cache: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open layer cache lock: %w", err)
	}
	// Blocking flock does not see ctx: take it in a goroutine so a
	// cancelled caller stops waiting (the lock, if it comes, is dropped).
	got := make(chan error, 1)
	go func() { got <- unix.Flock(int(f.Fd()), how) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock layer cache: %w", err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		go func() { <-got; f.Close() }()
		return nil, fmt.Errorf("lock layer cache: %w", ctx.Err())
	}
}

// PruneResult says what Prune removed.
type PruneResult struct {
	Removed int   // blobs and partial downloads
	Bytes   int64 // their size
	Kept    int   // blobs a template references
	// Images are the stored images of registry layers (base.go) that no
	// template is a fork of any more, removed from the store.
	Images int
}

// Prune removes from the layer cache at dir every blob no template of the
// store references (Meta.Layers), and what interrupted downloads left;
// and from the store the images of registry layers (base.go) no template
// is a fork of.
// It holds the cache's lock exclusively: an import in flight (which
// holds it shared from before it looks for its layers until its template
// records them) finishes first, and the next waits. A registry template
// imported before layers were recorded makes it refuse, removing nothing:
// its layers are unknown.
func Prune(ctx context.Context, store blockstore.Store, repo *blockstore.Repo, dir string) (PruneResult, error) {
	var res PruneResult
	unlock, err := lockCache(ctx, dir, unix.LOCK_EX)
	if err != nil {
		return res, fmt.Errorf("prune layer cache: %w", err)
	}
	defer unlock()
	keep := map[string]bool{}
	infos, err := List(ctx, store, repo)
	if err != nil {
		return res, fmt.Errorf("prune layer cache: %w", err)
	}
	for _, i := range infos {
		m, ok, err := ReadMeta(ctx, repo, i.Name)
		if err != nil {
			return res, fmt.Errorf("prune layer cache: %w", err)
		}
		if !ok {
			continue
		}
		if len(m.Layers) == 0 {
			return res, fmt.Errorf("prune layer cache: template %s was imported before its layers were recorded, so which it uses is unknown: nothing removed (re-import it, or remove the cache)", i.Name)
		}
		for _, l := range m.Layers {
			keep[l] = true
		}
	}
	if res.Images, err = pruneBases(ctx, store, repo); err != nil {
		return res, fmt.Errorf("prune layer cache: %w", err)
	}
	blobs := filepath.Join(dir, "blobs", "sha256")
	ents, err := os.ReadDir(blobs)
	if errors.Is(err, fs.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("prune layer cache: %w", err)
	}
	for _, e := range ents {
		if keep["sha256:"+e.Name()] {
			res.Kept++
			continue
		}
		if !strings.HasPrefix(e.Name(), ".partial-") && len(e.Name()) != 64 {
			continue // not ours
		}
		fi, err := e.Info()
		if err != nil {
			return res, fmt.Errorf("prune layer cache: %w", err)
		}
		if err := os.Remove(filepath.Join(blobs, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("prune layer cache: %w", err)
		}
		res.Removed++
		res.Bytes += fi.Size()
	}
	return res, syncFile(blobs)
}

// pruneBases removes the bases no template is a fork of (Remove checks
// again, failing closed). The caller holds the cache lock exclusively:
// an import that found a base forks it before it lets go of its shared
// hold. Imports through another layer cache do not take this lock: prune
// from one place per store.
func pruneBases(ctx context.Context, store blockstore.Store, repo *blockstore.Repo) (int, error) {
	prefix := string(blockstore.KindTemplate) + "/"
	keys, err := store.List(ctx, prefix)
	if err != nil {
		return 0, err
	}
	bases := map[string]bool{}
	used := map[string]bool{}
	for _, k := range keys {
		v, rest, ok := strings.Cut(strings.TrimPrefix(k, prefix), "/")
		if !ok {
			continue
		}
		if isBase(v) {
			bases[v] = true
		}
		if !strings.HasPrefix(rest, "gen/") {
			continue
		}
		var g uint64
		if _, err := fmt.Sscanf(strings.TrimPrefix(rest, "gen/"), "%d", &g); err != nil {
			continue
		}
		m, err := repo.Manifest(ctx, blockstore.GenRef{Volume: blockstore.Template(v), Generation: g})
		if err != nil {
			return 0, err // fail closed: it might be a fork
		}
		if m.Parent != nil && m.Parent.Volume.Kind == blockstore.KindTemplate {
			used[m.Parent.Volume.ID] = true
		}
	}
	n := 0
	for v := range bases {
		if used[v] {
			continue
		}
		b, err := repo.Meta(ctx, blockstore.Template(v))
		if errors.Is(err, blockstore.ErrNotFound) {
			continue // not a base: a template named like one
		}
		if err != nil {
			return n, err
		}
		var bm baseMeta
		if json.Unmarshal(b, &bm) != nil || bm.Source != sourceBase {
			continue
		}
		if err := Remove(ctx, store, repo, v); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
