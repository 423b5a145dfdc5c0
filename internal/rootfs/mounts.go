package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/holders"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/names"
)

// What the overlay and block roots share: a mount table read from a
// configurable file, a /proc to look in, a parent dir of one entry a
// generation.

// readMounts reads the mount table at path; empty means this process's.
func readMounts(path string) ([]mountinfo.Mount, error) {
	if path == "" {
		path = mountinfo.SelfPath
	}
	return mountinfo.ReadFile(path)
}

// procRoot is root, or /proc when empty.
func procRoot(root string) string {
	if root == "" {
		return mountinfo.ProcRoot
	}
	return root
}

// resolvedDir is dir cleaned, with symlinks resolved where it exists:
// mountinfo shows resolved paths, and every "is it mounted" answer
// compares against them.
func resolvedDir(dir string) string {
	d := filepath.Clean(dir)
	if r, err := filepath.EvalSymlinks(d); err == nil {
		return r
	}
	return d
}

// listIDs returns, sorted, the names of dir's entries and the first path
// component of every mount under dir: ids, the valid sandbox ids, and
// foreign, the rest (ctld never made them).
func listIDs(dir string, ms []mountinfo.Mount) (ids, foreign []string, err error) {
	seen := map[string]bool{}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	for _, e := range ents {
		seen[e.Name()] = true
	}
	for _, m := range mountinfo.Under(ms, dir) {
		if rel, err := filepath.Rel(dir, m.MountPoint); err == nil && rel != "." {
			seen[strings.SplitN(rel, "/", 2)[0]] = true
		}
	}
	for id := range seen {
		if names.CheckID("sandbox id", id) == nil {
			ids = append(ids, id)
		} else {
			foreign = append(foreign, id)
		}
	}
	slices.Sort(ids)
	slices.Sort(foreign)
	return ids, foreign, nil
}

// unmountUnder unmounts every mount at or under dir, deepest first, and
// reads the table again: left is a mount point still there, which keeps
// the caller from removing dir.
func unmountUnder(ctx context.Context, log *slog.Logger, read func() ([]mountinfo.Mount, error), dir string) (left string, err error) {
	ms, err := read()
	if err != nil {
		return "", err
	}
	var errs []error
	for _, m := range mountinfo.Under(ms, dir) {
		if err := unmountBusy(ctx, log, m.MountPoint); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	if ms, err = read(); err != nil {
		return "", err
	}
	if l := mountinfo.Under(ms, dir); len(l) > 0 {
		return l[0].MountPoint, nil
	}
	return "", nil
}

// checkPathGone is where a root's cleanup check starts: nothing mounted
// at or under path, and path itself gone (what names it in the detail).
// detail says what is left; "" when ok.
func checkPathGone(read func() ([]mountinfo.Mount, error), path, what string) (ok bool, detail string) {
	ms, err := read()
	if err != nil {
		return false, fmt.Sprintf("cannot read mounts: %v", err)
	}
	if left := mountinfo.Under(ms, path); len(left) > 0 {
		return false, fmt.Sprintf("%d mount(s) left at or under %s, first %s (%s from %s)", len(left), path, left[0].MountPoint, left[0].FSType, left[0].Source)
	}
	if _, err := os.Lstat(path); err == nil {
		return false, fmt.Sprintf("nothing mounted at %s but the %s still exists", path, what)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Sprintf("cannot stat %s: %v", path, err)
	}
	return true, ""
}

// holdersOf names (a few of) the processes that hold the filesystem of
// device dev ("major:minor") by cwd, root or an open file; "" when none.
func holdersOf(proc, dev string) (string, error) {
	maj, min, err := parseDev(dev)
	if err != nil {
		return "", err
	}
	refs, err := holders.Files(proc, unix.Mkdev(maj, min))
	if err != nil {
		return "", fmt.Errorf("cannot look for holders of %s: %w", dev, err)
	}
	return refList(refs), nil
}
