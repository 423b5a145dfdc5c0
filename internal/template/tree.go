package template

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/templatelock"
)

// ErrTreeNeedsRoot: an overlay tree was asked for by a builder that is not
// root, whose stage cannot carry the image's owners: the tree would serve
// every file as the builder's.
var ErrTreeNeedsRoot = errors.New("an overlay tree needs root")

// Trees is the directory of overlay templates (ctld's TemplatesDir: the
// template NAME is the directory Dir/NAME, the read-only lower of an
// overlay claim). An import that is given one keeps the tree it built the
// block image from there, so one import serves both root modes.
type Trees struct {
	Dir string
	// Mountinfo is the mount table checked before a tree is removed
	// (mountinfo.SelfPath when empty).
	Mountinfo string
}

// begin checks that template name may get a tree and returns the hidden
// path the build keeps it at until publish; "" when there is no Dir.
func (t Trees) begin(name string) (string, error) {
	if t.Dir == "" {
		return "", nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("keep the overlay tree of %s in %s: %w (--templates-dir none keeps no tree)", name, t.Dir, ErrTreeNeedsRoot)
	}
	if _, err := os.Lstat(filepath.Join(t.Dir, name)); err == nil {
		return "", fmt.Errorf("overlay tree %s: %w", filepath.Join(t.Dir, name), ErrTemplateExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("check overlay tree of %s: %w", name, err)
	}
	// An empty placeholder: the build renames its tree onto it (rename(2)
	// replaces an empty directory), so the tree lands next to its final
	// name, on the same file system.
	p, err := os.MkdirTemp(t.Dir, "."+name+".partial-")
	if err != nil {
		return "", fmt.Errorf("stage overlay tree of %s: %w", name, err)
	}
	return p, nil
}

// publish moves the kept tree at p to its name, refusing to replace one
// that appeared meanwhile.
func (t Trees) publish(p, name string) error {
	if p == "" {
		return nil
	}
	dst := filepath.Join(t.Dir, name)
	err := unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without RENAME_NOREPLACE: check, then rename
		// (rename(2) still refuses a non-empty directory).
		if _, lerr := os.Lstat(dst); lerr == nil {
			err = unix.EEXIST
		} else {
			err = unix.Rename(p, dst)
		}
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = ErrTemplateExists
		}
		return fmt.Errorf("publish overlay tree of %s: %w", name, err)
	}
	return syncFile(t.Dir)
}

// publishImported publishes the tree of a template just stored in the
// block store: a failure says the block template stays.
func (t Trees) publishImported(p, name string) error {
	if err := t.publish(p, name); err != nil {
		return fmt.Errorf("import template %s: stored for block mode, but %w (template rm %s removes it)", name, err, name)
	}
	return nil
}

// drop removes a kept tree that was not published.
func (t Trees) drop(p string) {
	if _, err := os.Lstat(p); p != "" && err == nil {
		_ = removeStage(p)
	}
}

// Has reports whether template name has an overlay tree.
func (t Trees) Has(name string) (bool, error) {
	if t.Dir == "" {
		return false, nil
	}
	fi, err := os.Lstat(filepath.Join(t.Dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check overlay tree of %s: %w", name, err)
	}
	return fi.IsDir(), nil
}

// Names lists the templates that have an overlay tree (hidden entries,
// a build's stage or a removal's aside, are not templates), sorted.
func (t Trees) Names() ([]string, error) {
	if t.Dir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(t.Dir)
	if err != nil {
		return nil, fmt.Errorf("list overlay trees: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && blockstore.Template(e.Name()).Check() == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// checkUnused refuses while an overlay mount has template name's tree
// as a lower layer (the kernel's mount table is the truth: removing a
// lower under a live overlay is undefined behaviour).
func (t Trees) checkUnused(name string) error {
	ms, err := mountinfo.ReadFile(cmp.Or(t.Mountinfo, mountinfo.SelfPath))
	if err != nil {
		return fmt.Errorf("remove overlay tree of %s: %w", name, err)
	}
	dir := filepath.Join(t.Dir, name)
	for _, m := range ms {
		if m.FSType != "overlay" {
			continue
		}
		lower, _ := mountinfo.Option(m.SuperOptions, "lowerdir")
		for _, l := range strings.Split(lower, ":") {
			if filepath.Clean(l) == dir {
				return fmt.Errorf("remove overlay tree of %s: %w by the overlay at %s", name, ErrTemplateInUse, m.MountPoint)
			}
		}
	}
	return nil
}

// removeAside renames template name's tree aside, to a hidden
// .NAME.removing-* that no claim can name, and returns that path ("":
// no tree); dropAside deletes it. An interrupted removal leaves no half
// tree under the name.
func (t Trees) removeAside(name string) (string, error) {
	ok, err := t.Has(name)
	if err != nil || !ok {
		return "", err
	}
	aside, err := os.MkdirTemp(t.Dir, "."+name+".removing-")
	if err != nil {
		return "", fmt.Errorf("remove overlay tree of %s: %w", name, err)
	}
	if err := unix.Rename(filepath.Join(t.Dir, name), aside); err != nil { // onto the empty aside
		_ = os.Remove(aside)
		return "", fmt.Errorf("remove overlay tree of %s: %w", name, err)
	}
	return aside, nil
}

func (t Trees) dropAside(name, aside string) error {
	if aside == "" {
		return nil
	}
	if err := removeStage(aside); err != nil {
		return fmt.Errorf("remove overlay tree of %s: %w", name, err)
	}
	return syncFile(t.Dir)
}

// RemoveTemplate removes template name from both root modes: refused
// while an overlay mount has its tree as a lower or a sandbox generation
// is built over its block image (Remove); the block template goes first,
// then the tree. A name with either is removed (what an interrupted
// remove left too); one with neither is ErrTemplateNotFound.
func (t Trees) RemoveTemplate(ctx context.Context, store blockstore.Store, repo *blockstore.Repo, name string) error {
	if err := blockstore.Template(name).Check(); err != nil {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	aside, err := t.removeTemplateLocked(ctx, store, repo, name)
	if err != nil {
		return err
	}
	// The tree's files go without the lock: no claim can name the aside.
	return t.dropAside(name, aside)
}

// removeTemplateLocked does RemoveTemplate's checks and removals under the
// templates lock, held exclusive against ctld's claims mounting overlays
// (templatelock): from the mount table's check until the tree is renamed
// aside, no overlay can start using it. It returns the aside path.
func (t Trees) removeTemplateLocked(ctx context.Context, store blockstore.Store, repo *blockstore.Repo, name string) (string, error) {
	if t.Dir != "" {
		unlock, err := templatelock.Exclusive(ctx, t.Dir)
		if err != nil {
			return "", fmt.Errorf("remove template %s: %w", name, err)
		}
		defer unlock()
	}
	has, err := t.Has(name)
	if err != nil {
		return "", err
	}
	if has {
		if err := t.checkUnused(name); err != nil {
			return "", err
		}
	}
	if err := Remove(ctx, store, repo, name); err != nil && !(has && errors.Is(err, ErrTemplateNotFound)) {
		return "", err
	}
	return t.removeAside(name)
}
