// Package cowdev is the copy-on-write device of one attached sandbox: an
// nbdsrv.Backend over a block-store generation (the base), a local sparse
// dirty file and a local chunk cache.
//
// Reads of a chunk the sandbox wrote come from the dirty file; other chunks
// come from the cache, or are fetched from the store (verified by the
// store's AEAD) and cached (with a local store, only for a partial read:
// see Config.LocalStore); a hole in the manifest chain reads as zeros, and
// Extents reports it (and zeroed chunks) to the NBD client's block status.
// Writes go to the dirty file a whole chunk at a time: a partial write of a clean chunk first copies the chunk's base in. Trim and
// WriteZeroes mark whole chunks "zero" (a hole in the dirty file) and zero
// partial ranges, so a trimmed range never reads as the base.
//
// Crash semantics: Sync fdatasyncs the dirty file, then atomically replaces
// the index (chunk → clean, data, zero) beside it. After a crash, Open finds
// the state of the last Sync that returned: every write, trim and zeroing
// acknowledged before it. Writes not followed by a Sync may or may not show,
// only in chunks that were already dirty (data) at the last Sync, and torn
// as a disk's write may be; a chunk that was clean or zero at the last Sync
// reads as the base or as zeros again.
package cowdev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/basecache"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cleanup"
	"github.com/ctld/ctld/internal/nbdsrv"
)

// Chunk states, as kept in memory and in the index.
const (
	stClean uint8 = 0 // the base generation's chunk
	stData  uint8 = 1 // the dirty file's chunk
	stZero  uint8 = 2 // zeros (trimmed or zeroed whole), hides the base
	// stLocal: the base's chunk, with a copy in the dirty file (reads
	// and writes go there, as for stData): a chunk a seal committed.
	// Not dirty, so the next seal does not write it again.
	stLocal uint8 = 3
)

// File names inside Config.Dir.
const (
	dirtyName = "dirty"
	indexName = "index"
	cacheName = "cache" // cache.0 … cache.<cacheFiles-1>
	sealName  = "seal"  // a seal's copies of chunks written during its upload
)

// cacheFiles is the number of files the chunk cache is striped over:
// chunk i is in cache.<i%cacheFiles> at (i/cacheFiles)*chunk size. A
// buffered write holds its file's inode lock while it copies (and, on a
// cold pass, allocates the page cache): one cache file made concurrent
// fetches wait on, and spin for, each other's cache writes.
const cacheFiles = 16

// stripes bounds the per-chunk locks: chunk i is guarded by lock i%stripes.
const stripes = 1024

// Config describes a device.
type Config struct {
	Repo *blockstore.Repo
	// Base is the generation the device writes over (the head).
	Base blockstore.GenRef
	// Dir holds the dirty file, its index and the chunk cache; it is
	// created if missing. Re-opening the same Dir with the same Base finds
	// what the last Sync acknowledged.
	Dir string
	// FetchTimeout bounds one chunk fetch from the store (default 1 min).
	FetchTimeout time.Duration
	// LocalStore says the store is on this host (a dir store): a fetch
	// is CPU, not latency, so the chunks of one read are fetched inline
	// instead of concurrently (no goroutine per chunk; the server already
	// runs requests concurrently). And a whole-chunk read is not cached:
	// the object is in the host's page cache already, the cache would
	// save only its decryption and decoding, and its fresh pages cost a
	// cold read more than that (docs/architecture.md, "Block read path").
	// A partial read is cached either way (else every 4 KiB read would
	// decode its whole chunk), and so is every fetch of a remote store.
	LocalStore bool
	// Readahead is how many chunks past a sequential read are fetched
	// ahead, in the background (default 16, 1 MiB of 64 KiB chunks;
	// negative: none): into the cache, or with a LocalStore into a ring
	// in memory until read. See Device.readahead.
	Readahead int
	// Shared, if set, is the node's base cache, used when the device's
	// base is a template's generation (read by many devices; a
	// sandbox's or volume's own generation is read by one): chunks this
	// device fetches from the store go there, and those other devices
	// put there are read from it. Not used after a Seal (the new base is
	// the sandbox's). A cache that cannot be opened is logged and not
	// used.
	Shared *basecache.Cache
	Logger *slog.Logger
}

// ErrMismatch: Dir holds the dirty state of another base or geometry.
var ErrMismatch = errors.New("dirty state belongs to another base")

// Device is the copy-on-write device. Safe for concurrent use.
type Device struct {
	ctx context.Context // bounds store fetches; from Open
	// im is the opened base generation; a seal swaps it for the new
	// generation (see Seal).
	im     atomic.Pointer[blockstore.Image]
	cfg    Config
	log    *slog.Logger
	cs     int64
	size   int64
	dirty  *os.File
	cache  [cacheFiles]*os.File
	locks  [stripes]sync.RWMutex
	zeroes []byte    // one chunk of zeros, read-only
	bufs   sync.Pool // chunk buffers (*[]byte) of the read path's fetches

	// stateMu guards state, version and base; state[i] changes only
	// under chunk i's stripe lock too, so a holder of that lock may read
	// it.
	stateMu sync.RWMutex
	state   []uint8
	version uint64            // bumped on every state change
	baseRef blockstore.GenRef // the generation im is (cfg.Base until a seal)
	// dirtySet holds the chunks whose state is dirty (data or zero): a
	// seal's barrier copies it, in time that follows the dirty chunks,
	// not the device's size.
	dirtySet map[int64]struct{}
	// cached[i] changes and is read only under chunk i's stripe lock.
	cached []bool
	// shared is the base's generation in Config.Shared while the base is
	// that generation; a seal clears it before it rebases (see Seal).
	// sharedGen is the same, kept to be closed.
	shared    atomic.Pointer[basecache.Gen]
	sharedGen *basecache.Gen

	// Readahead: raq holds the chunk indices queued for the prefetch
	// workers (capacity Config.Readahead: a full queue drops, it never
	// blocks a read); streams are the recent sequential readers.
	raq     chan int64
	raMu    sync.Mutex
	streams [raStreams]raStream
	raNext  int
	raStop  context.CancelFunc
	raWG    sync.WaitGroup
	// pre is the prefetch ring of a local store's device (nil otherwise):
	// chunks fetched ahead of a sequential reader, held in memory until
	// read; guarded by preMu. A chunk enters and leaves it only under its
	// chunk's lock (eviction aside), and only while the chunk is clean.
	preMu   sync.Mutex
	pre     []preSlot
	preNext int

	// wbar is the seal's write barrier: every write, trim and zeroing
	// holds it shared for its whole request; a seal takes it exclusive
	// for the instant it copies the states (reads never take it).
	wbar sync.RWMutex
	// sealMu: one seal at a time. sealing is the seal in flight (nil
	// when none): writes consult it (see beforeWrite).
	sealMu  sync.Mutex
	sealing atomic.Pointer[sealRun]
	// sealHook, if set (tests), runs after each chunk a seal uploads.
	sealHook func(i uint64)

	syncMu    sync.Mutex // one Sync at a time
	syncedVer uint64
	fetches   uint64 // store fetches (for tests), under stateMu
	closeOnce sync.Once
}

var _ nbdsrv.Backend = (*Device)(nil)

// Open opens the device: the base generation's manifest chain, and the
// dirty state in cfg.Dir (created empty the first time). ctx bounds the
// device's store fetches for its whole life.
func Open(ctx context.Context, cfg Config) (*Device, error) {
	if cfg.Repo == nil || cfg.Dir == "" {
		return nil, errors.New("cowdev: Repo and Dir are required")
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = time.Minute
	}
	if cfg.Readahead == 0 {
		cfg.Readahead = defaultReadahead
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	im, err := cfg.Repo.Open(ctx, cfg.Base)
	if err != nil {
		return nil, fmt.Errorf("cowdev: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cowdev: %w", err)
	}
	state, im, err := openIndex(ctx, cfg, im, log)
	if err != nil {
		return nil, err
	}
	base := im.Manifest().Ref()
	d := &Device{
		ctx: ctx, cfg: cfg, log: log, baseRef: base,
		cs: int64(im.ChunkSize()), size: int64(im.DeviceSize()),
		zeroes: make([]byte, im.ChunkSize()),
	}
	d.im.Store(im)
	n := im.Chunks()
	if state == nil {
		state = make([]uint8, n)
	}
	d.state = state
	d.dirtySet = map[int64]struct{}{}
	for i, s := range state {
		if isDirty(s) {
			d.dirtySet[int64(i)] = struct{}{}
		}
	}
	d.cached = make([]bool, n)
	// Each file is closed again if a later step fails.
	var cu cleanup.Cleanup
	defer cu.Clean()
	if d.dirty, err = openSized(filepath.Join(cfg.Dir, dirtyName), d.size, false); err != nil {
		return nil, err
	}
	cu.Add(func() { _ = d.dirty.Close() })
	// The cache starts empty: its map is not kept across opens.
	// (A single "cache" file is the layout of older versions.)
	d.raStop = func() {}
	_ = os.Remove(filepath.Join(cfg.Dir, cacheName))
	per := (int64(n) + cacheFiles - 1) / cacheFiles * d.cs
	for k := range d.cache {
		f, err := openSized(filepath.Join(cfg.Dir, fmt.Sprintf("%s.%d", cacheName, k)), per, true)
		if err != nil {
			return nil, err
		}
		d.cache[k] = f
		cu.Add(func() { _ = f.Close() })
	}
	// The files now belong to d (Close closes them); nothing below fails.
	cu.Release()
	if cfg.Shared != nil && base.Volume.Kind == blockstore.KindTemplate {
		g, err := cfg.Shared.Generation(base, d.cs, int64(n))
		if err != nil {
			log.Warn("base cache not used", "base", base.String(), "err", err)
		} else {
			d.sharedGen = g
			d.shared.Store(g)
		}
	}
	if cfg.Readahead > 0 {
		d.startReadahead(ctx)
	}
	return d, nil
}

// openIndex reads the index in cfg.Dir for a device over im (cfg.Base):
// nil states when there is none yet. An index of another geometry, or of
// a base other than cfg.Base, is ErrMismatch, with two exceptions that
// are the crash windows of a seal (see Seal): it commits generation G
// over base B, then replaces the index (base G) atomically, and only
// then can the writer's spec (and the primary's journal) name G.
//
//   - The index names B and cfg.Base is G, whose parent is B: a crash
//     after the commit, before the index was replaced. Every chunk G
//     holds was dirty when the seal began, and the seal synced the index
//     before its upload, so that index has each of them as data or zero
//     (a chunk only becomes clean again by a rebase): none reads the
//     base, and the clean ones read the same in B and G. The states are
//     taken as they are, over G (the next seal writes those chunks again;
//     their objects exist already).
//   - The index names G, whose parent is cfg.Base B: a crash after the
//     index was replaced, before the spec named G. The device is opened
//     over G (a chunk the seal zeroed is clean over G, and would read B's
//     data over B), and Base reports G.
//
// Only one step either way: a spec two seals behind is refused.
func openIndex(ctx context.Context, cfg Config, im *blockstore.Image, log *slog.Logger) ([]uint8, *blockstore.Image, error) {
	path := filepath.Join(cfg.Dir, indexName)
	got, state, err := readIndex(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, im, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("cowdev: %w", err)
	}
	want := indexHeader{base: cfg.Base.String(), chunkSize: uint32(im.ChunkSize()), deviceSize: im.DeviceSize()}
	if got.chunkSize != want.chunkSize || got.deviceSize != want.deviceSize {
		return nil, nil, mismatch(path, got, want)
	}
	if got.base == want.base {
		return state, im, nil
	}
	if p := im.Manifest().Parent; p != nil && p.String() == got.base {
		log.Warn("the dirty state is of the base's parent: a seal committed the base and stopped before its rebase; taking the state over the base",
			"index_base", got.base)
		return state, im, nil
	}
	ref, err := blockstore.ParseGenRef(got.base)
	if err != nil {
		return nil, nil, mismatch(path, got, want)
	}
	child, err := cfg.Repo.Open(ctx, ref)
	if err != nil || child.Manifest().Parent == nil || *child.Manifest().Parent != cfg.Base ||
		child.ChunkSize() != im.ChunkSize() || child.DeviceSize() != im.DeviceSize() {
		return nil, nil, mismatch(path, got, want)
	}
	log.Warn("the dirty state is of a generation sealed over the base: a seal rebased and the spec does not name it yet; opening over it",
		"index_base", got.base)
	return state, child, nil
}

// img is the base generation's image.
func (d *Device) img() *blockstore.Image { return d.im.Load() }

// cacheAt is the cache file of chunk i and the chunk's offset in it.
func (d *Device) cacheAt(i int64) (*os.File, int64) {
	return d.cache[i%cacheFiles], i / cacheFiles * d.cs
}

// readCache reads len(p) bytes at offset in of cached chunk i.
func (d *Device) readCache(i, in int64, p []byte) error {
	f, at := d.cacheAt(i)
	return readFull(f, p, at+in)
}

func openSized(path string, size int64, truncate bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cowdev: %w", err)
	}
	if truncate {
		err = f.Truncate(0)
	}
	if err == nil {
		err = f.Truncate(size)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cowdev: size %s: %w", path, err)
	}
	return f, nil
}

// Close closes the files; it does not Sync.
func (d *Device) Close() error {
	var err error
	d.closeOnce.Do(func() {
		// No prefetch may touch the files once they are closed.
		d.raStop()
		d.raWG.Wait()
		var errs []error
		for _, f := range append([]*os.File{d.dirty}, d.cache[:]...) {
			if f != nil {
				errs = append(errs, f.Close())
			}
		}
		// Unmapped: no read may run now (the caller's contract, as for
		// the files).
		d.shared.Store(nil)
		if d.sharedGen != nil {
			errs = append(errs, d.sharedGen.Close())
		}
		err = errors.Join(errs...)
	})
	return err
}

// Base is the generation the device writes over: Config.Base, or the
// generation the last seal committed (or one Open found the dirty state
// rebased onto; see openIndex).
func (d *Device) Base() blockstore.GenRef {
	d.stateMu.RLock()
	defer d.stateMu.RUnlock()
	return d.baseRef
}

// ChunkSize is the chunk size in bytes.
func (d *Device) ChunkSize() int { return int(d.cs) }

func (d *Device) Size() (int64, error) { return d.size, nil }

func (d *Device) lock(i int64) *sync.RWMutex { return &d.locks[i%stripes] }

func (d *Device) setState(i int64, s uint8) {
	d.stateMu.Lock()
	if old := d.state[i]; old != s {
		d.state[i] = s
		d.version++
		if was, is := isDirty(old), isDirty(s); is && !was {
			d.dirtySet[i] = struct{}{}
		} else if was && !is {
			delete(d.dirtySet, i)
		}
	}
	d.stateMu.Unlock()
	if s != stClean {
		// The base is hidden for good: a prefetched copy is dead weight.
		if bp := d.takePrefetched(i); bp != nil {
			d.bufs.Put(bp)
		}
	}
}

// span calls fn for each chunk of [off, off+n): chunk index, offset in the
// chunk, and the span's offset from off and length.
func (d *Device) span(off, n int64, fn func(i, in, at, l int64) error) error {
	if off < 0 || n < 0 || off+n > d.size {
		return fmt.Errorf("cowdev: range [%d,+%d) beyond device of %d bytes: %w", off, n, d.size, unix.EINVAL)
	}
	for at := int64(0); at < n; {
		i, in := (off+at)/d.cs, (off+at)%d.cs
		l := min(d.cs-in, n-at)
		if err := fn(i, in, at, l); err != nil {
			return err
		}
		at += l
	}
	return nil
}

// fetchParallel bounds the concurrent store fetches of one read.
const fetchParallel = 8

func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	// The chunks of a read that need a store fetch are fetched
	// concurrently: a read spanning several waits about one fetch's
	// latency (a remote store's), not their sum. The rest is served
	// inline. Each chunk keeps its own locking, so this changes nothing
	// about what a chunk reads as.
	d.readahead(off, int64(len(p)))
	multi := !d.cfg.LocalStore && off/d.cs != (off+int64(len(p))-1)/d.cs
	var g errgroup.Group
	g.SetLimit(fetchParallel)
	err := d.span(off, int64(len(p)), func(i, in, at, l int64) error {
		if multi && d.needsFetch(i) {
			g.Go(func() error { return d.readChunk(i, in, p[at:at+l]) })
			return nil
		}
		return d.readChunk(i, in, p[at:at+l])
	})
	if gerr := g.Wait(); err == nil {
		err = gerr
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// needsFetch says chunk i would be fetched from the store now (a hint:
// readChunk decides under the chunk's lock).
func (d *Device) needsFetch(i int64) bool {
	mu := d.lock(i)
	mu.RLock()
	need := d.state[i] == stClean && !d.cached[i]
	mu.RUnlock()
	return need && !d.img().IsZero(uint64(i)) && !d.sharedHas(i)
}

func (d *Device) readChunk(i, in int64, p []byte) error {
	mu := d.lock(i)
	mu.RLock()
	switch d.state[i] {
	case stData, stLocal:
		err := readFull(d.dirty, p, i*d.cs+in)
		mu.RUnlock()
		return err
	case stZero:
		mu.RUnlock()
		clear(p)
		return nil
	}
	if d.cached[i] {
		err := d.readCache(i, in, p)
		mu.RUnlock()
		return err
	}
	if g := d.shared.Load(); g != nil && g.Has(int64(i)) {
		err := g.ReadAt(p, i, in)
		mu.RUnlock()
		return err
	}
	mu.RUnlock()
	// Fetch under the write lock: one fetch per chunk, however many
	// readers wait for it.
	mu.Lock()
	defer mu.Unlock()
	switch {
	case d.state[i] == stData || d.state[i] == stLocal:
		return readFull(d.dirty, p, i*d.cs+in)
	case d.state[i] == stZero:
		clear(p)
		return nil
	case d.cached[i]:
		return d.readCache(i, in, p)
	}
	if int64(len(p)) == d.cs {
		// A whole chunk: fetched straight into p; cached only when the
		// store is remote (see Config.LocalStore).
		return d.load(d.ctx, i, p, !d.cfg.LocalStore)
	}
	bp := d.chunkBuf()
	defer d.bufs.Put(bp)
	if err := d.base(i, *bp); err != nil {
		return err
	}
	copy(p, (*bp)[in:])
	return nil
}

func (d *Device) chunkBuf() *[]byte {
	if bp, ok := d.bufs.Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, d.cs)
	return &b
}

// base fills buf with chunk i of the base generation, from the cache, a
// prefetched buffer or the store, and caches it. The caller holds chunk
// i's write lock.
func (d *Device) base(i int64, buf []byte) error { return d.load(d.ctx, i, buf, true) }

// load is base with the fetch bounded by ctx too, and the cache write
// only if cache is set. With a shared cache, a fetched chunk goes there
// instead of the device's own (a prefetched one is there already).
func (d *Device) load(ctx context.Context, i int64, buf []byte, cache bool) error {
	if d.cached[i] {
		return d.readCache(i, 0, buf)
	}
	if d.img().IsZero(uint64(i)) {
		clear(buf)
		return nil
	}
	g := d.shared.Load()
	if bp := d.takePrefetched(i); bp != nil {
		copy(buf, *bp)
		d.bufs.Put(bp)
	} else if g != nil && g.Has(i) {
		return g.ReadAt(buf, i, 0)
	} else if err := d.fetch(ctx, i, buf); err != nil {
		return err
	}
	switch {
	case g != nil:
		g.Put(i, buf) // a no-op if the prefetch put it
	case cache:
		d.cacheChunk(i, buf)
	}
	return nil
}

var _ nbdsrv.FileReader = (*Device)(nil)

// ReadFiles answers a read from the shared base cache's files when every
// chunk of it is clean and cached there (nbdsrv sends them with
// sendfile): the read path of a device over a template a node has read
// before, with one copy of the data instead of two. Anything else (a
// written, zeroed or uncached chunk, a hole) is read with ReadAt. The
// base cache's chunks never change, and its files stay open until Close.
func (d *Device) ReadFiles(segs []nbdsrv.FileSegment, off int64, n int) ([]nbdsrv.FileSegment, bool) {
	g := d.shared.Load()
	if g == nil || off < 0 || n <= 0 || off+int64(n) > d.size {
		return segs, false
	}
	ok := true
	_ = d.span(off, int64(n), func(i, in, _, l int64) error {
		// The cache is looked at again under the chunk's lock: a seal
		// clears it before its rebase changes any chunk's state, so a
		// state seen with the cache still set is the old base's.
		mu := d.lock(i)
		mu.RLock()
		clean := d.state[i] == stClean && d.shared.Load() == g
		mu.RUnlock()
		if !clean || !g.Has(i) {
			ok = false
			return errStop
		}
		fd, at := g.File(i)
		segs = append(segs, nbdsrv.FileSegment{Fd: fd, Off: at + in, Len: int(l)})
		return nil
	})
	return segs, ok
}

// errStop ends a span early.
var errStop = errors.New("stop")

// sharedHas says chunk i is in the shared cache of the device's base.
func (d *Device) sharedHas(i int64) bool {
	g := d.shared.Load()
	return g != nil && g.Has(i)
}

// fetch reads chunk i from the store into buf.
func (d *Device) fetch(ctx context.Context, i int64, buf []byte) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.FetchTimeout)
	defer cancel()
	d.stateMu.Lock()
	d.fetches++
	d.stateMu.Unlock()
	if err := d.img().ReadChunk(ctx, uint64(i), buf); err != nil {
		// ErrCorrupt and store errors alike reach the client as EIO.
		d.log.Error("fetch chunk", "chunk", i, "err", err)
		return fmt.Errorf("cowdev: %w", err)
	}
	return nil
}

// cacheChunk writes chunk i's base (buf) to the cache. A failure is
// logged: the data is good, only the cache failed.
func (d *Device) cacheChunk(i int64, buf []byte) {
	f, at := d.cacheAt(i)
	if _, err := f.WriteAt(buf, at); err != nil {
		d.log.Warn("cache chunk", "chunk", i, "err", err)
		return
	}
	d.cached[i] = true
}

var _ nbdsrv.ExtentLister = (*Device)(nil)

// maxExtents bounds one Extents answer (the NBD client asks again).
const maxExtents = 1 << 14

// Extents reports which chunks of [off, off+length) read as zeros without
// a fetch (a hole of the base chain, or zeroed/trimmed here): an NBD
// client's block status, so nbdcopy and qemu-img skip them. Everything
// else is data. A snapshot: a concurrent write may change it.
func (d *Device) Extents(off, length int64) ([]nbdsrv.Extent, error) {
	if off < 0 || length <= 0 || off+length > d.size {
		return nil, fmt.Errorf("cowdev: extents [%d,+%d) beyond device of %d bytes: %w", off, length, d.size, unix.EINVAL)
	}
	var out []nbdsrv.Extent
	d.stateMu.RLock()
	defer d.stateMu.RUnlock()
	for at, end := off, off+length; at < end; {
		i := at / d.cs
		l := min((i+1)*d.cs, end) - at
		st := d.state[i]
		zero := st == stZero || (st == stClean && d.img().IsZero(uint64(i)))
		if n := len(out); n > 0 && out[n-1].Zero == zero {
			out[n-1].Length += l
		} else if n == maxExtents {
			break
		} else {
			out = append(out, nbdsrv.Extent{Length: l, Hole: zero, Zero: zero})
		}
		at += l
	}
	return out, nil
}

func (d *Device) WriteAt(p []byte, off int64) (int, error) {
	d.wbar.RLock()
	defer d.wbar.RUnlock()
	err := d.span(off, int64(len(p)), func(i, in, at, l int64) error {
		return d.writeChunk(i, in, p[at:at+l])
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeChunk writes p (nil: zeros) at offset in of chunk i.
func (d *Device) writeChunk(i, in int64, p []byte) error {
	mu := d.lock(i)
	mu.Lock()
	defer mu.Unlock()
	d.beforeWrite(i)
	pos := i*d.cs + in
	if st := d.state[i]; st == stData || st == stLocal || int64(len(p)) == d.cs {
		if p == nil {
			p = d.zeroes[:0]
		}
		if _, err := d.dirty.WriteAt(p, pos); err != nil {
			return fmt.Errorf("cowdev: write dirty chunk %d: %w", i, err)
		}
		d.setState(i, stData)
		return nil
	}
	// Copy on write: the chunk's base (or zeros), then the write, as one
	// whole chunk; the state says data only once it is all there.
	buf := make([]byte, d.cs)
	if d.state[i] == stClean {
		if err := d.base(i, buf); err != nil {
			return err
		}
	}
	copy(buf[in:], p)
	if _, err := d.dirty.WriteAt(buf, i*d.cs); err != nil {
		return fmt.Errorf("cowdev: write dirty chunk %d: %w", i, err)
	}
	d.setState(i, stData)
	return nil
}

func (d *Device) Trim(off, length int64) error { return d.zero(off, length) }

// WriteZeroes zeroes the range; noHole is not kept (a zero chunk is a hole
// in the dirty file and in the next generation either way).
func (d *Device) WriteZeroes(off, length int64, noHole bool) error { return d.zero(off, length) }

func (d *Device) zero(off, length int64) error {
	d.wbar.RLock()
	defer d.wbar.RUnlock()
	return d.span(off, length, func(i, in, at, l int64) error {
		if l == d.cs {
			mu := d.lock(i)
			mu.Lock()
			defer mu.Unlock()
			d.beforeWrite(i)
			d.setState(i, stZero)
			// Free the space; the state already reads as zeros, and a
			// data chunk later written partially is rewritten whole.
			if err := unix.Fallocate(int(d.dirty.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, i*d.cs, d.cs); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
				d.log.Warn("punch dirty chunk", "chunk", i, "err", err)
			}
			return nil
		}
		mu := d.lock(i)
		mu.RLock()
		st := d.state[i]
		mu.RUnlock()
		if st == stZero {
			return nil
		}
		return d.writeChunk(i, in, d.zeroes[:l])
	})
}

// Sync makes durable every write, trim and zeroing that returned before
// it: the state is taken first (so it names only chunks whose bytes are
// already in the dirty file), the dirty file is fdatasynced, then the
// index is replaced atomically.
func (d *Device) Sync() error {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	return d.syncLocked()
}

// syncLocked is Sync; the caller holds syncMu.
func (d *Device) syncLocked() error {
	d.stateMu.RLock()
	ver, base := d.version, d.baseRef
	var snap []uint8
	if ver != d.syncedVer {
		snap = append([]uint8(nil), d.state...)
	}
	d.stateMu.RUnlock()
	if err := unix.Fdatasync(int(d.dirty.Fd())); err != nil {
		return fmt.Errorf("cowdev: fdatasync dirty file: %w", err)
	}
	if snap == nil {
		return nil
	}
	hdr := indexHeader{base: base.String(), chunkSize: uint32(d.cs), deviceSize: uint64(d.size)}
	if err := writeIndex(filepath.Join(d.cfg.Dir, indexName), hdr, snap); err != nil {
		return err
	}
	d.syncedVer = ver
	return nil
}

// isDirty says a chunk in state s is changed over the base: the next
// seal writes it.
func isDirty(s uint8) bool { return s == stData || s == stZero }

// Dirty lists the chunks the device changed over its base (written or
// zeroed), in increasing order.
func (d *Device) Dirty() []uint64 {
	d.stateMu.RLock()
	out := make([]uint64, 0, len(d.dirtySet))
	for i := range d.dirtySet {
		out = append(out, uint64(i))
	}
	d.stateMu.RUnlock()
	slices.Sort(out)
	return out
}

// ChunkWriter takes chunks of a new generation; *blockstore.Writer is one.
type ChunkWriter interface {
	WriteChunk(ctx context.Context, i uint64, data []byte) error
}

// WriteDirty writes every dirty chunk to w (a zero chunk as nil: a hole
// that hides the base), so a seal can commit them as a generation over
// Base. Writes that race with it land or not chunk by chunk; a seal
// quiesces the device first.
func (d *Device) WriteDirty(ctx context.Context, w ChunkWriter) error {
	buf := make([]byte, d.cs)
	for _, i := range d.Dirty() {
		mu := d.lock(int64(i))
		mu.RLock()
		st := d.state[i]
		var err error
		if st == stData {
			err = readFull(d.dirty, buf, int64(i)*d.cs)
		}
		mu.RUnlock()
		if err != nil {
			return err
		}
		var data []byte
		if st == stData {
			data = buf
		}
		if err := w.WriteChunk(ctx, i, data); err != nil {
			return fmt.Errorf("cowdev: seal chunk %d: %w", i, err)
		}
	}
	return nil
}

func readFull(f *os.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if errors.Is(err, io.EOF) && n == len(p) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("cowdev: read %s at %d: %w", f.Name(), off, err)
	}
	return nil
}
