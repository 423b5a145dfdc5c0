package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
)

// sharedTree returns the overlay tree of a template that is a fork of
// the stored image base (another import of the same layers), "" when no
// template has one.
func (t Trees) sharedTree(ctx context.Context, repo *blockstore.Repo, base string) (string, error) {
	if t.Dir == "" {
		return "", nil
	}
	ents, err := os.ReadDir(t.Dir)
	if err != nil {
		return "", fmt.Errorf("list overlay trees: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || blockstore.Template(e.Name()).Check() != nil {
			continue
		}
		m, ok, err := ReadMeta(ctx, repo, e.Name())
		if err != nil || !ok || m.Image != base {
			continue // a tree without its template (a crashed rm) is not trusted
		}
		return filepath.Join(t.Dir, e.Name()), nil
	}
	return "", nil
}

// cloneTree makes dst (an empty directory) a copy of the tree src whose
// regular files are hard links to src's (one inode each: contents, owner,
// mode and xattrs shared; both are read-only overlay lowers), and whose
// directories and symlinks are new, with src's owners, modes, xattrs and
// times. Cheap: a few syscalls per entry, no data copied.
func cloneTree(ctx context.Context, src, dst string) error {
	var dirs []string // to get their times after their children
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if rel != "." {
				if err := os.Mkdir(to, 0o700); err != nil {
					return err
				}
			}
			dirs = append(dirs, rel)
		case unix.S_IFREG:
			return os.Link(p, to)
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		default:
			return fmt.Errorf("clone tree: %s is not a file, directory or symlink", p)
		}
		if err := unix.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", to, err)
		}
		if err := copyXattrs(p, to); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			ts := []unix.Timespec{st.Atim, st.Mtim}
			return unix.UtimesNanoAt(unix.AT_FDCWD, to, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("clone tree %s: %w", src, err)
	}
	// Modes and times last, deepest first: a read-only directory must not
	// stop its children, and each child made touches its parent's mtime.
	slices.Reverse(dirs)
	for _, rel := range dirs {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(src, rel), &st); err != nil {
			return fmt.Errorf("clone tree %s: %w", src, err)
		}
		to := filepath.Join(dst, rel)
		if err := unix.Chmod(to, st.Mode&0o7777); err != nil {
			return fmt.Errorf("clone tree %s: chmod %s: %w", src, to, err)
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, to, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("clone tree %s: times of %s: %w", src, to, err)
		}
	}
	return nil
}

// copyXattrs copies the xattrs of the directory or symlink at from to to
// (a regular file's are its inode's, shared by the link).
func copyXattrs(from, to string) error {
	if fi, err := os.Lstat(to); err == nil && fi.Mode().IsRegular() {
		return nil
	}
	sz, err := unix.Llistxattr(from, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return err
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(from, buf); err != nil {
		return fmt.Errorf("list xattrs of %s: %w", from, err)
	}
	for _, k := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if k == "" {
			continue
		}
		n, err := unix.Lgetxattr(from, k, nil)
		if err != nil {
			return fmt.Errorf("xattr %s of %s: %w", k, from, err)
		}
		v := make([]byte, n)
		if n, err = unix.Lgetxattr(from, k, v); err != nil {
			return fmt.Errorf("xattr %s of %s: %w", k, from, err)
		}
		if err := unix.Lsetxattr(to, k, v[:n], 0); err != nil {
			return fmt.Errorf("set xattr %s of %s: %w", k, to, err)
		}
	}
	return nil
}

// resetDir empties the directory p (what a failed clone left).
func resetDir(p string) error {
	if err := removeStage(p); err != nil {
		return fmt.Errorf("reset %s: %w", p, err)
	}
	if err := os.Mkdir(p, 0o700); err != nil {
		return fmt.Errorf("reset %s: %w", p, err)
	}
	return nil
}
