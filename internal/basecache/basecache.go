// Package basecache is a node's cache of template generations' chunks,
// decrypted and decoded, shared by every writer process on the node.
//
// Why: every sandbox claimed from a template reads the same base chunks,
// and each read from the block store costs an object open and read,
// AES-GCM and decompression (about 1 s of CPU per GiB). A template
// generation is immutable, so the first writer that reads a chunk leaves
// its plaintext here and every later device of the node reads it with
// one pread, as qemu-nbd reads a local raw base.
//
// Layout: Root/<boot id>/<volume kind>/<volume id>/<generation>-<chunk
// size>x<chunks>/ (the geometry in the name: an opener that disagrees
// never reads another's layout) holds
// "data.0" to "data.15" (sparse; chunk i in data.<i%16> at i/16 chunks:
// a buffered write holds its file's inode lock while it copies, so one
// file would make the concurrent fills of a sequential read wait on each
// other) and "map" (a bit per chunk,
// mmapped shared by every process that opens the generation). A chunk is
// published by writing its data first, then setting its bit: a reader
// that sees the bit reads the whole chunk (the page cache is shared, so
// the data a finished pwrite left is visible to every process). A process
// that dies between the two leaves the bit clear; the next reader fetches
// and writes the chunk again.
//
// The boot id scopes the cache: after a host crash the map may be on disk
// without the data it names, so a new boot never trusts what an earlier
// one left (Open removes it). Only generations whose content cannot change
// belong here: the caller decides (the writer caches template bases).
// What is cached is as trusted as the node's other local state (the
// writers' dirty files): it is not authenticated again on read.
package basecache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cleanup"
)

// DefaultMinFree is Options.MinFree's default: chunks are cached only
// while the cache's filesystem has this share of its space free.
const DefaultMinFree = 0.10

// Options tune a Cache.
type Options struct {
	// MinFree (0 to 1) is the share of the filesystem that must stay
	// free: at or below it nothing more is cached (reads go to the store, as
	// without a cache). 0 means DefaultMinFree.
	MinFree float64
	Logger  *slog.Logger
	// bootID, if set (tests), stands in for the kernel's boot id.
	bootID string
}

// Cache is the cache of one node (one boot), rooted at a directory.
type Cache struct {
	dir  string // Root/<boot id>
	opts Options
	log  *slog.Logger
}

// Open opens (creating it) the cache under root for this boot, and
// removes what earlier boots left beside it (best effort: a leftover is
// logged and tried again at the next Open).
func Open(root string, opts Options) (*Cache, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("base cache: root %q is not absolute", root)
	}
	if opts.MinFree <= 0 {
		opts.MinFree = DefaultMinFree
	}
	if opts.MinFree > 1 {
		return nil, fmt.Errorf("base cache: min free %v is more than the whole filesystem", opts.MinFree)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	boot := opts.bootID
	if boot == "" {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return nil, fmt.Errorf("base cache: boot id: %w", err)
		}
		boot = strings.TrimSpace(string(b))
	}
	if boot == "" || strings.ContainsAny(boot, "/.") {
		return nil, fmt.Errorf("base cache: bad boot id %q", boot)
	}
	if err := os.MkdirAll(filepath.Join(root, boot), 0o700); err != nil {
		return nil, fmt.Errorf("base cache: %w", err)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("base cache: %w", err)
	}
	for _, e := range ents {
		if e.Name() == boot {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			log.Warn("base cache: remove an earlier boot's cache", "dir", e.Name(), "err", err)
		}
	}
	return &Cache{dir: filepath.Join(root, boot), opts: opts, log: log}, nil
}

// Dir is this boot's cache directory.
func (c *Cache) Dir() string { return c.dir }

// Gen is the cache of one generation, open in this process. Safe for
// concurrent use.
type Gen struct {
	ref    blockstore.GenRef
	cs     int64
	chunks int64
	data   [stripes]*os.File
	bits   []byte // the mmapped map: one bit per chunk, in uint32 words
	c      *Cache
	puts   atomic.Uint64
	full   atomic.Bool // the filesystem is below MinFree: nothing more is cached
	once   sync.Once
}

// stripes is the number of data files a generation's chunks are striped
// over.
const stripes = 16

// checkEvery is how many puts pass between free-space checks.
const checkEvery = 256

// Generation opens the cache of generation ref of chunks chunks of
// chunkSize bytes (the generation's geometry, from its manifest), making
// it if this is the first opener of the boot. Files of a size the
// geometry does not give are an error (the cache is then not used).
func (c *Cache) Generation(ref blockstore.GenRef, chunkSize, chunks int64) (*Gen, error) {
	if chunkSize <= 0 || chunks <= 0 {
		return nil, fmt.Errorf("base cache %s: bad geometry %d chunks of %d bytes", ref, chunks, chunkSize)
	}
	if err := ref.Volume.Check(); err != nil {
		return nil, fmt.Errorf("base cache %s: %w", ref, err)
	}
	dir := filepath.Join(c.dir, string(ref.Volume.Kind), ref.Volume.ID, fmt.Sprintf("%d-%dx%d", ref.Generation, chunkSize, chunks))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("base cache %s: %w", ref, err)
	}
	g := &Gen{ref: ref, cs: chunkSize, chunks: chunks, c: c}
	// Each file is closed again if a later step fails.
	var cu cleanup.Cleanup
	defer cu.Clean()
	per := (chunks + stripes - 1) / stripes * chunkSize
	for k := range g.data {
		f, err := sized(filepath.Join(dir, "data."+strconv.Itoa(k)), per)
		if err != nil {
			return nil, fmt.Errorf("base cache %s: %w", ref, err)
		}
		g.data[k] = f
		cu.Add(func() { _ = f.Close() })
	}
	words := (chunks + 31) / 32
	mf, err := sized(filepath.Join(dir, "map"), words*4)
	if err == nil {
		g.bits, err = unix.Mmap(int(mf.Fd()), 0, int(words*4), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		_ = mf.Close() // the mapping keeps the file
	}
	if err != nil {
		return nil, fmt.Errorf("base cache %s: map: %w", ref, err)
	}
	cu.Release() // the files and the mapping now belong to g (Close)
	g.checkFree()
	return g, nil
}

// at is the data file of chunk i and the chunk's offset in it.
func (g *Gen) at(i int64) (int, int64) {
	return int(g.data[i%stripes].Fd()), i / stripes * g.cs
}

func (g *Gen) closeFiles() error {
	var errs []error
	for _, f := range g.data {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// sized opens (creating) path and gives it size bytes; an existing file of
// another size is refused, never truncated (other processes read it).
func sized(path string, size int64) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	switch {
	case err != nil:
	case st.Size() == 0:
		err = f.Truncate(size)
	case st.Size() != size:
		err = fmt.Errorf("%s has %d bytes, want %d: another geometry", path, st.Size(), size)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// Ref is the generation this is the cache of.
func (g *Gen) Ref() blockstore.GenRef { return g.ref }

// word is the map word of chunk i, and i's bit in it.
func (g *Gen) word(i int64) (*uint32, uint32) {
	// The mapping is page-aligned, so every word is 4-byte aligned, as
	// the atomics need.
	return (*uint32)(unsafe.Pointer(&g.bits[i/32*4])), 1 << (i % 32)
}

// File is where cached chunk i lies: the open data file's descriptor and
// the chunk's offset in it (for sendfile). Valid until Close.
func (g *Gen) File(i int64) (fd int, off int64) { return g.at(i) }

// Has says chunk i is cached.
func (g *Gen) Has(i int64) bool {
	if i < 0 || i >= g.chunks {
		return false
	}
	w, bit := g.word(i)
	return atomic.LoadUint32(w)&bit != 0
}

// ReadAt reads len(p) bytes at offset in of cached chunk i (Has(i) must
// have said so).
func (g *Gen) ReadAt(p []byte, i, in int64) error {
	if in < 0 || in+int64(len(p)) > g.cs {
		return fmt.Errorf("base cache %s: read [%d,+%d) of a chunk of %d bytes", g.ref, in, len(p), g.cs)
	}
	fd, base := g.at(i)
	for off := 0; off < len(p); {
		n, err := unix.Pread(fd, p[off:], base+in+int64(off))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("base cache %s: read chunk %d: %w", g.ref, i, err)
		case n == 0:
			return fmt.Errorf("base cache %s: read chunk %d: short file", g.ref, i)
		}
		off += n
	}
	return nil
}

// Put caches chunk i (a whole chunk, verified by the store's read). It
// is best effort: a failure, or a filesystem below MinFree, leaves the
// chunk uncached and is logged once.
func (g *Gen) Put(i int64, chunk []byte) {
	if i < 0 || i >= g.chunks || int64(len(chunk)) != g.cs || g.full.Load() || g.Has(i) {
		return
	}
	if g.puts.Add(1)%checkEvery == 0 {
		g.checkFree()
		if g.full.Load() {
			return
		}
	}
	fd, base := g.at(i)
	for off := 0; off < len(chunk); {
		n, err := unix.Pwrite(fd, chunk[off:], base+int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			g.stop("write", err)
			return
		}
		off += n
	}
	w, bit := g.word(i)
	atomic.OrUint32(w, bit)
}

// checkFree stops caching when the filesystem is below MinFree.
func (g *Gen) checkFree() {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(g.data[0].Fd()), &st); err != nil {
		g.stop("statfs", err)
		return
	}
	if st.Blocks > 0 && float64(st.Bavail) <= g.c.opts.MinFree*float64(st.Blocks) {
		g.stop("free space", fmt.Errorf("%d of %d blocks free, below %.0f%%", st.Bavail, st.Blocks, 100*g.c.opts.MinFree))
	}
}

// stop ends caching for this Gen (reads of what is cached go on).
func (g *Gen) stop(what string, err error) {
	g.full.Store(true)
	g.once.Do(func() {
		g.c.log.Warn("base cache: no more chunks are cached", "generation", g.ref.String(), "cause", what, "err", err)
	})
}

// Close unmaps the map and closes the data files.
func (g *Gen) Close() error {
	return errors.Join(unix.Munmap(g.bits), g.closeFiles())
}

// Prune removes this boot's caches of generations keep says are gone (a
// removed template's), and returns how many it removed. keep is asked
// once per cached generation; an error from it keeps that cache (in
// doubt, nothing is removed) and is returned with the others. A writer
// that has a removed cache open keeps reading its open files.
func (c *Cache) Prune(ctx context.Context, keep func(context.Context, blockstore.GenRef) (bool, error)) (int, error) {
	removed := 0
	var errs []error
	kinds, err := os.ReadDir(c.dir)
	if err != nil {
		return 0, fmt.Errorf("base cache prune: %w", err)
	}
	for _, k := range kinds {
		ids, err := os.ReadDir(filepath.Join(c.dir, k.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range ids {
			vol, err := blockstore.ParseVolume(k.Name() + "/" + id.Name())
			if err != nil {
				continue // not a cache of ours: left alone
			}
			dir := filepath.Join(c.dir, k.Name(), id.Name())
			gens, err := os.ReadDir(dir)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			left := len(gens)
			for _, g := range gens {
				n, _, ok := strings.Cut(g.Name(), "-")
				gen, perr := strconv.ParseUint(n, 10, 64)
				if !ok || perr != nil {
					continue
				}
				if err := ctx.Err(); err != nil {
					return removed, errors.Join(append(errs, err)...)
				}
				ref := blockstore.GenRef{Volume: vol, Generation: gen}
				k, err := keep(ctx, ref)
				if err != nil {
					errs = append(errs, fmt.Errorf("base cache prune %s: %w", ref, err))
					continue
				}
				if k {
					continue
				}
				if err := os.RemoveAll(filepath.Join(dir, g.Name())); err != nil {
					errs = append(errs, err)
					continue
				}
				removed++
				left--
				c.log.Info("base cache of a removed generation pruned", "generation", ref.String())
			}
			if left == 0 {
				_ = os.Remove(dir) // empty; a new cache may race it: then it stays
			}
		}
	}
	return removed, errors.Join(errs...)
}
