// Package dirstore is the default blockstore backend: objects are files
// under a root directory, one file per key ('/' in a key is a directory).
//
// Put writes a temp file beside the object, fsyncs it, hard-links it to the
// key's name (link(2) never replaces, so an existing object stays as it
// was) and fsyncs the directory: after a crash the object is whole or
// absent, never torn. A batch (NewBatch: a Writer's chunks) makes all its
// objects' data durable before it links any of them, and the links before
// its commit returns, with the same guarantee and no sync per object. Temp files start with '.', which no key segment may,
// so List never sees them; a crash can leave one behind, which Sweep
// removes.
package dirstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/fsutil"
)

// Store is a blockstore.Store in a directory.
type Store struct {
	root string
	ops  fsOps
	// syncFS: a batch syncs the whole file system twice (syncfs(2): its
	// data, then its names) instead of fsyncing each of its files and
	// directories, at most syncJobs at a time. Cheaper for the commit
	// alone (BenchmarkCommit 32 MiB: ~450 ms vs ~585 per file, ~675 with
	// a durable Put each), but it also flushes everything else dirty on
	// the file system (an import's scratch image, the writers' dirty
	// files), so it is off: for a store on a file system of its own.
	syncFS bool
}

var _ blockstore.Store = (*Store)(nil)

// Open returns the store rooted at root, creating the directory (0700: the
// objects are encrypted, but their names and sizes are still the tenant's)
// if it is missing.
func Open(root string) (*Store, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("open dir store: root %q is not absolute", root)
	}
	if err := mkdirs(osOps{}, filepath.Clean(root), true); err != nil {
		return nil, fmt.Errorf("open dir store: %w", err)
	}
	return &Store{root: filepath.Clean(root), ops: osOps{}}, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

func (s *Store) path(key string) string {
	return filepath.Join(s.root, filepath.FromSlash(key))
}

// Put creates key with data durably, or fails with blockstore.ErrExists.
func (s *Store) Put(ctx context.Context, key string, data []byte) error {
	if err := blockstore.CheckKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	p := s.path(key)
	dir := filepath.Dir(p)
	if err := mkdirs(s.ops, dir, true); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	tmp, err := s.ops.writeTemp(dir, filepath.Base(p), data, true)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	// The temp name goes in every case: on success p is the second link.
	defer s.ops.remove(tmp)
	if err := s.ops.link(tmp, p); err != nil {
		// A directory where the object would go (key "a" when "a/b"
		// exists) is also an existing name.
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("put %s: %w", key, blockstore.ErrExists)
		}
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := s.ops.syncDir(dir); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Get reads the whole object.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := blockstore.CheckKey(key); err != nil {
		return nil, err
	}
	// GetBuffer reads what fstat says, within the key's size limit.
	return s.GetBuffer(ctx, key, nil)
}

var _ blockstore.BufferGetter = (*Store)(nil)

// openObject opens key's file for reading with plain syscalls (the chunk
// read path: open, fstat, pread, close, none of os.File's poller setup per
// object). CheckKey leaves nothing for filepath.Join to clean (no empty,
// "." or ".." segments): the path in one allocation.
func (s *Store) openObject(key string) (int, string, error) {
	p := s.root + "/" + key
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		if err == unix.ENOENT || err == unix.ENOTDIR {
			return -1, p, fmt.Errorf("get %s: %w", key, blockstore.ErrNotFound)
		}
		return -1, p, fmt.Errorf("get %s: %w", key, &fs.PathError{Op: "open", Path: p, Err: err})
	}
	return fd, p, nil
}

// GetBuffer is Get into buf's storage (grown if the object does not fit).
func (s *Store) GetBuffer(ctx context.Context, key string, buf []byte) ([]byte, error) {
	if err := blockstore.CheckKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	fd, p, err := s.openObject(key)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, &fs.PathError{Op: "fstat", Path: p, Err: err})
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, fmt.Errorf("get %s: %w", key, blockstore.ErrNotFound)
	}
	if limit := blockstore.MaxObjectSize(key); st.Size > limit {
		return nil, fmt.Errorf("get %s: %w: %d bytes, at most %d for this kind of object", key, blockstore.ErrTooLarge, st.Size, limit)
	}
	n := int(st.Size)
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	for off := 0; off < n; {
		m, err := unix.Pread(fd, buf[off:], int64(off))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, fmt.Errorf("get %s: %w", key, &fs.PathError{Op: "pread", Path: p, Err: err})
		case m == 0:
			return nil, fmt.Errorf("get %s: %w", key, io.ErrUnexpectedEOF)
		}
		off += m
	}
	return buf, nil
}

// Delete removes the object and fsyncs its directory; a missing key is
// success. Emptied directories are left in place (a concurrent Put may be
// about to use them).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blockstore.CheckKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	p := s.path(key)
	fi, err := os.Lstat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		return nil // a directory of other keys: no object by this name
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if err := fsutil.SyncDir(filepath.Dir(p)); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List returns the keys starting with prefix, sorted.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	err := s.walk(ctx, prefix, func(key string, _ fs.DirEntry) error {
		keys = append(keys, key)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(keys)
	return keys, nil
}

var _ blockstore.Lister = (*Store)(nil)

// ListInfo is List with each object's size and modification time.
func (s *Store) ListInfo(ctx context.Context, prefix string) ([]blockstore.ObjectInfo, error) {
	var out []blockstore.ObjectInfo
	err := s.walk(ctx, prefix, func(key string, d fs.DirEntry) error {
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted since the directory was read
		}
		if err != nil {
			return err
		}
		out = append(out, blockstore.ObjectInfo{Key: key, ModTime: fi.ModTime(), Size: fi.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// walk calls fn for every object whose key starts with prefix.
func (s *Store) walk(ctx context.Context, prefix string, fn func(key string, d fs.DirEntry) error) error {
	if err := blockstore.CheckPrefix(prefix); err != nil {
		return err
	}
	// Walk the deepest directory the prefix names in full; a partial last
	// segment ("gen/00" of "gen/0001") is filtered by string prefix.
	dir := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		dir = prefix[:i]
	}
	start := s.root
	if dir != "" {
		start = s.path(dir)
	}
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") && p != start {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil // a temp file of a Put in flight (or a crashed one)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		if k := filepath.ToSlash(rel); strings.HasPrefix(k, prefix) {
			return fn(k, d)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list %q: %w", prefix, err)
	}
	return nil
}

// Sweep removes temp files older than age that crashed Puts left behind,
// and returns how many it removed. A Put in flight has a young temp file,
// so an age of minutes never races one.
func (s *Store) Sweep(ctx context.Context, age time.Duration) (int, error) {
	cutoff := time.Now().Add(-age)
	n := 0
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), ".") || !strings.Contains(d.Name(), ".tmp-") {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if fi.ModTime().Before(cutoff) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("sweep %s: %w", s.root, err)
	}
	return n, nil
}

// mkdirs creates dir and any missing parents. With durable, it fsyncs
// each parent that got a new entry so an object's path survives a crash;
// without, the caller must make the path durable before it promises
// anything (a batch's commit syncs every directory up to the root): a new
// volume's first commit creates up to 256 chunk directories, and an fsync
// of their parent for each cost a third of the commit's time.
func mkdirs(ops fsOps, dir string, durable bool) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("mkdir %s: %w", dir, syscall.ENOTDIR)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirs(ops, parent, durable); err != nil {
			return err
		}
	}
	if err := ops.mkdir(dir); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // a concurrent Put made it
		}
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if !durable {
		return nil
	}
	return ops.syncDir(parent)
}
