package template

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Errors of an import, matched with errors.Is; each is wrapped with the
// entry or file it is about.
var (
	// ErrUnsafePath: an entry's name or hard-link target is absolute,
	// has a ".." component, or resolves through a symlink out of the root.
	ErrUnsafePath = errors.New("unsafe path")
	// ErrBadSource: the source cannot be read as what it claims to be
	// (corrupt tar, missing manifest, unknown kind).
	ErrBadSource = errors.New("bad template source")
	// ErrImageTooSmall: the tree does not fit in the requested size.
	ErrImageTooSmall = errors.New("image size too small for the tree")
	// ErrUnsupportedFS: a file system type the builder cannot make.
	ErrUnsupportedFS = errors.New("unsupported file system type")
)

// Progress is reported after every entry of an import and once per later
// phase, so a caller can show how far a long import got.
type Progress struct {
	Phase   string // "unpack", "mkfs", "fixup", "done" (image built); "upload", "stored" (Import: Entries counts chunks)
	Entries int64  // entries written so far
	Bytes   int64  // file content bytes written so far
}

// Skipped is a source entry the builder did not put into the image.
type Skipped struct {
	Path   string
	Reason string
}

// meta is the ownership, mode, times and xattrs an entry must have in the
// image: the stage directory cannot always carry them (a non-root builder
// cannot chown), so they are kept aside and compared after the unpack.
type meta struct {
	typ    byte // tar.TypeDir, tar.TypeReg, tar.TypeSymlink
	mode   fs.FileMode
	uid    int
	gid    int
	mtime  time.Time
	xattrs map[string]string
}

// unpacker writes tar entries into a stage directory through an os.Root, so
// no name, symlink or hard link can reach outside it.
type unpacker struct {
	root     *os.Root
	metas    map[string]*meta // by clean relative path; "." is the root
	skipped  []Skipped
	progress func(Progress)
	entries  int64
	bytes    int64
	blocks   int64 // 4 KiB blocks the content needs, for the size check
	// maxBytes bounds the content (the image's size): a file past it is
	// refused from its header, before a byte is written, so a sparse or
	// highly compressed 10 GiB claim never reaches the stage's disk.
	maxBytes int64
}

// Bounds of a tree's names and entries, beyond the image's size.
const (
	maxPathLen     = 4095 // PATH_MAX less the NUL
	maxNameLen     = 255  // one component, ext4's limit
	maxTreeEntries = 1 << 22
)

func newUnpacker(dir string, progress func(Progress), maxBytes int64) (*unpacker, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open stage %s: %w", dir, err)
	}
	u := &unpacker{root: r, metas: map[string]*meta{}, progress: progress, maxBytes: maxBytes}
	// A tree without a "./" entry gets the usual root: 0755 root:root, so
	// non-root workloads can traverse "/".
	u.metas["."] = &meta{typ: tar.TypeDir, mode: fs.ModeDir | 0o755}
	return u, nil
}

func (u *unpacker) close() error { return u.root.Close() }

// cleanName turns a tar name into a clean relative path, refusing absolute
// names and ".." components rather than silently rewriting them.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("empty name: %w", ErrUnsafePath)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("absolute name %q: %w", name, ErrUnsafePath)
	}
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("name %q has a NUL byte: %w", name, ErrUnsafePath)
	}
	if len(name) > maxPathLen {
		return "", fmt.Errorf("name of %d bytes (at most %d): %w", len(name), maxPathLen, ErrUnsafePath)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("name %q has a .. component: %w", name, ErrUnsafePath)
		}
		if len(c) > maxNameLen {
			return "", fmt.Errorf("name %q has a component of %d bytes (at most %d): %w", name, len(c), maxNameLen, ErrUnsafePath)
		}
	}
	return path.Clean(name), nil
}

// escapeErr marks os.Root's "path escapes from parent" (a symlinked parent
// pointing outside) as ErrUnsafePath.
func escapeErr(name string, err error) error {
	if err != nil && strings.Contains(err.Error(), "escapes") {
		return fmt.Errorf("%s: %w: %w", name, ErrUnsafePath, err)
	}
	return err
}

// add writes one entry. r is the entry's content for a regular file.
func (u *unpacker) add(h *tar.Header, r io.Reader) error {
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	if u.entries >= maxTreeEntries {
		return fmt.Errorf("more than %d entries: %w", maxTreeEntries, ErrBadSource)
	}
	if h.Typeflag == tar.TypeReg && u.maxBytes > 0 && (h.Size < 0 || h.Size > u.maxBytes-u.blocks*4096) {
		return fmt.Errorf("file %s of %d bytes does not fit in the image's %d bytes (%d used): %w", name, h.Size, u.maxBytes, u.blocks*4096, ErrImageTooSmall)
	}
	m := &meta{mode: h.FileInfo().Mode(), uid: h.Uid, gid: h.Gid, mtime: h.ModTime}
	for k, v := range h.PAXRecords {
		if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			if m.xattrs == nil {
				m.xattrs = map[string]string{}
			}
			m.xattrs[x] = v
		}
	}
	if name == "." {
		if h.Typeflag != tar.TypeDir {
			return fmt.Errorf("root entry is not a directory: %w", ErrBadSource)
		}
		m.typ = tar.TypeDir
		u.metas["."] = m
		return u.done(0)
	}
	if err := u.parents(name, h.ModTime); err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		m.typ = tar.TypeDir
		fi, err := u.root.Lstat(name)
		if err == nil && fi.IsDir() {
			u.metas[name] = m
			return u.done(0)
		}
		if err := u.replace(name); err != nil {
			return err
		}
		// Owner-writable and searchable while unpacking, so a non-root
		// builder can fill it; the real mode is applied at the end.
		if err := u.root.Mkdir(name, 0o700); err != nil {
			return escapeErr(name, fmt.Errorf("create dir %s: %w", name, err))
		}
	case tar.TypeReg: // archive/tar reports old TypeRegA entries as TypeReg
		m.typ = tar.TypeReg
		if err := u.replace(name); err != nil {
			return err
		}
		f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return escapeErr(name, fmt.Errorf("create %s: %w", name, err))
		}
		n, err := io.Copy(f, &countReader{r: r, u: u})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if n != h.Size {
			return fmt.Errorf("write %s: %d bytes of %d: %w", name, n, h.Size, ErrBadSource)
		}
		u.blocks += (n + 4095) / 4096
	case tar.TypeSymlink:
		m.typ = tar.TypeSymlink
		if err := u.replace(name); err != nil {
			return err
		}
		if err := u.root.Symlink(h.Linkname, name); err != nil {
			return escapeErr(name, fmt.Errorf("create symlink %s: %w", name, err))
		}
	case tar.TypeLink:
		target, err := cleanName(h.Linkname)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", name, err)
		}
		tm, ok := u.metas[target]
		if !ok || tm.typ != tar.TypeReg {
			return fmt.Errorf("hard link %s to %s: not an earlier regular file: %w", name, target, ErrBadSource)
		}
		if err := u.replace(name); err != nil {
			return err
		}
		if err := u.root.Link(target, name); err != nil {
			return escapeErr(name, fmt.Errorf("hard link %s to %s: %w", name, target, err))
		}
		// One inode: the link shares (and the image keeps) the target's metadata.
		u.metas[name] = tm
		return u.done(0)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// A template is a root file system for a sandbox whose /dev the
		// runtime provides; device nodes in an image are never needed and a
		// non-root builder could not make them.
		u.skipped = append(u.skipped, Skipped{Path: name, Reason: "device node or fifo"})
		return u.done(0)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		u.skipped = append(u.skipped, Skipped{Path: name, Reason: fmt.Sprintf("tar type %q", h.Typeflag)})
		return u.done(0)
	}
	u.metas[name] = m
	return u.done(0)
}

func (u *unpacker) done(int) error {
	u.entries++
	if u.progress != nil {
		u.progress(Progress{Phase: "unpack", Entries: u.entries, Bytes: u.bytes})
	}
	return nil
}

// parents makes the missing parent directories of name, as Docker does for
// a layer that lists a file before (or without) its directory: 0755
// root:root. A parent that exists but is not a directory is an error.
func (u *unpacker) parents(name string, mtime time.Time) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	if m, ok := u.metas[dir]; ok && m.typ == tar.TypeDir {
		// Made by this unpack and not replaced since (replace drops the
		// metas of what it removes): no lstat of every ancestor for every
		// entry. A path that is no directory any more still fails safely
		// at the create, inside the root.
		return nil
	}
	if err := u.parents(dir, mtime); err != nil {
		return err
	}
	fi, err := u.root.Lstat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		// Followed inside the root by os.Root; one that leaves it fails
		// there with ErrUnsafePath.
		return nil
	case err == nil:
		return fmt.Errorf("parent %s of %s is not a directory: %w", dir, name, ErrBadSource)
	case !errors.Is(err, fs.ErrNotExist):
		return escapeErr(name, fmt.Errorf("lstat %s: %w", dir, err))
	}
	if err := u.root.Mkdir(dir, 0o700); err != nil {
		return escapeErr(name, fmt.Errorf("create dir %s: %w", dir, err))
	}
	u.metas[dir] = &meta{typ: tar.TypeDir, mode: fs.ModeDir | 0o755, mtime: mtime}
	return nil
}

// replace removes what a later entry of the same name overrides; a
// directory over a directory is kept (tar semantics).
func (u *unpacker) replace(name string) error {
	if _, err := u.root.Lstat(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return escapeErr(name, fmt.Errorf("lstat %s: %w", name, err))
	}
	if err := u.root.RemoveAll(name); err != nil {
		return escapeErr(name, fmt.Errorf("replace %s: %w", name, err))
	}
	for p := range u.metas {
		if p == name || strings.HasPrefix(p, name+"/") {
			delete(u.metas, p)
		}
	}
	return nil
}

type countReader struct {
	r io.Reader
	u *unpacker
}

// progressEvery is how much of one file is copied between reports, so a
// single large file still shows progress.
const progressEvery = 16 << 20

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	before := c.u.bytes
	c.u.bytes += int64(n)
	if c.u.progress != nil && before/progressEvery != c.u.bytes/progressEvery {
		c.u.progress(Progress{Phase: "unpack", Entries: c.u.entries, Bytes: c.u.bytes})
	}
	return n, err
}

// fixup is what the stage could not carry for one path and the image must
// get through debugfs: ownership or mode, and xattrs.
type fixup struct {
	path   string
	meta   *meta
	inode  bool              // set uid, gid and mode
	xattrs map[string]string // set these xattrs
}

// finish applies every entry's final ownership, mode, xattrs and times to
// the stage, deepest first (a parent made read-only must not stop the
// children's updates), and returns what it could not apply.
func (u *unpacker) finish() ([]fixup, error) {
	paths := make([]string, 0, len(u.metas))
	for p := range u.metas {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int {
		if d := strings.Count(b, "/") - strings.Count(a, "/"); d != 0 || a == "." || b == "." {
			if a == "." {
				return 1
			}
			if b == "." {
				return -1
			}
			return d
		}
		return strings.Compare(a, b)
	})
	root := os.Geteuid() == 0
	var fixes []fixup
	for _, p := range paths {
		m := u.metas[p]
		fx := fixup{path: p, meta: m}
		if root {
			if err := u.root.Lchown(p, m.uid, m.gid); err != nil {
				return nil, fmt.Errorf("chown %s: %w", p, err)
			}
		}
		if m.typ != tar.TypeSymlink {
			if err := u.root.Chmod(p, m.mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
				return nil, fmt.Errorf("chmod %s: %w", p, err)
			}
			for k, v := range m.xattrs {
				if err := u.setxattr(p, k, v); err != nil {
					// Not allowed (a non-root builder and a trusted. or
					// security. name) or not supported by the stage's file
					// system: debugfs sets it in the image instead.
					if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.ENOTSUP) {
						return nil, fmt.Errorf("set xattr %s of %s: %w", k, p, err)
					}
					if fx.xattrs == nil {
						fx.xattrs = map[string]string{}
					}
					fx.xattrs[k] = v
				}
			}
			if err := u.root.Chtimes(p, m.mtime, m.mtime); err != nil {
				return nil, fmt.Errorf("set times of %s: %w", p, err)
			}
		}
		// mkfs.ext4 -d copies what lstat says; where that is not what the
		// source said (a non-root builder, a setuid bit cleared by chown, the
		// root directory that mkfs makes itself), debugfs sets it after.
		fi, err := u.root.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("lstat %s: %w", p, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		want := unixMode(m)
		if p == "." || int(st.Uid) != m.uid || int(st.Gid) != m.gid || (m.typ != tar.TypeSymlink && st.Mode != want) {
			fx.inode = true
		}
		if fx.inode || fx.xattrs != nil {
			fixes = append(fixes, fx)
		}
	}
	return fixes, nil
}

func (u *unpacker) setxattr(p, k, v string) error {
	f, err := u.root.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fsetxattr(int(f.Fd()), k, []byte(v), 0)
}

// unixMode is the st_mode an entry must have: type bits and permissions.
func unixMode(m *meta) uint32 {
	mode := uint32(m.mode.Perm())
	if m.mode&fs.ModeSetuid != 0 {
		mode |= unix.S_ISUID
	}
	if m.mode&fs.ModeSetgid != 0 {
		mode |= unix.S_ISGID
	}
	if m.mode&fs.ModeSticky != 0 {
		mode |= unix.S_ISVTX
	}
	switch m.typ {
	case tar.TypeDir:
		mode |= unix.S_IFDIR
	case tar.TypeSymlink:
		mode |= unix.S_IFLNK
	default:
		mode |= unix.S_IFREG
	}
	return mode
}

// removeStage deletes a stage tree even when a non-root builder made some of
// its directories read-only.
func removeStage(dir string) error {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
