package blockstore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// Repo is the block store: volumes of chunked, encrypted generations in a
// Store. It is the API the NBD writer and the template import use: Open a
// generation and read its chunks, Commit dirty chunks as a new generation.
// Safe for concurrent use.
type Repo struct {
	store Store
	keys  *Keyring
	codec *codec
	// Parallel object writes of one commit (S3 latency hides behind it).
	uploads int
	// Chunks a packing commit seals at once (compression and AEAD are
	// its CPU; the caller reads the next chunk meanwhile).
	sealers int
	// blobs recycles the read path's object buffers (*[]byte) when the
	// store is a BufferGetter.
	blobs sync.Pool
}

// Options tune a Repo.
type Options struct {
	// Compression of what the repo seals (each object's kept only when
	// smaller); "" is CompressNone. Reads take what each object says.
	Compression Compression
	// Uploads bounds a commit's parallel object writes (default 8).
	Uploads int
	// Sealers bounds the chunks a packing commit seals at once (default
	// GOMAXPROCS).
	Sealers int
}

// New returns a repo over store whose data keys node wraps.
func New(store Store, node *NodeKey, opts Options) (*Repo, error) {
	c, err := newCodec(opts.Compression)
	if err != nil {
		return nil, err
	}
	if opts.Uploads <= 0 {
		opts.Uploads = 8
	}
	if opts.Sealers <= 0 {
		opts.Sealers = runtime.GOMAXPROCS(0)
	}
	return &Repo{store: store, keys: NewKeyring(store, node), codec: c, uploads: opts.Uploads, sealers: opts.Sealers}, nil
}

// Object keys of a volume v:
//
//	v/key                         its wrapped data key
//	v/gen/<generation, 20 digits> the manifest of a generation
//	v/chunks/<hh>/<sum, 64 hex>   a chunk, named by its keyed checksum
func manifestKey(r GenRef) string {
	return fmt.Sprintf("%s/gen/%020d", r.Volume, r.Generation)
}

func chunkKey(v Volume, sum [32]byte) string {
	// One allocation: it is built for every chunk read.
	var b [160]byte
	k := append(b[:0], v.Kind...)
	k = append(append(k, '/'), v.ID...)
	k = append(k, "/chunks/"...)
	k = hex.AppendEncode(k, sum[:1])
	k = hex.AppendEncode(append(k, '/'), sum[:])
	return string(k)
}

func (dk *DataKey) sum(chunk []byte) [32]byte {
	m := hmac.New(sha256.New, dk.macKey)
	m.Write(chunk)
	var s [32]byte
	m.Sum(s[:0])
	return s
}

// Generations lists the committed generations of v, oldest first.
func (r *Repo) Generations(ctx context.Context, v Volume) ([]uint64, error) {
	if err := v.Check(); err != nil {
		return nil, err
	}
	keys, err := r.store.List(ctx, v.String()+"/gen/")
	if err != nil {
		return nil, fmt.Errorf("list generations of %s: %w", v, err)
	}
	gens := make([]uint64, 0, len(keys))
	for _, k := range keys {
		s := strings.TrimPrefix(k, v.String()+"/gen/")
		g, err := strconv.ParseUint(s, 10, 64)
		if err != nil || len(s) != 20 {
			return nil, fmt.Errorf("list generations of %s: %w: stray object %s", v, ErrCorrupt, k)
		}
		gens = append(gens, g)
	}
	return gens, nil
}

// Manifest loads, authenticates and validates the manifest of ref.
func (r *Repo) Manifest(ctx context.Context, ref GenRef) (*Manifest, error) {
	if err := ref.Volume.Check(); err != nil {
		return nil, err
	}
	key := manifestKey(ref)
	blob, err := r.store.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	dk, err := r.keys.Get(ctx, ref.Volume)
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	payload, err := r.codec.open(dk, kindManifest, key, blob)
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	m, err := DecodeManifest(payload)
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w: %w", ref, ErrCorrupt, err)
	}
	if m.Ref() != ref {
		return nil, fmt.Errorf("manifest of %s: %w: it is the manifest of %s", ref, ErrCorrupt, m.Ref())
	}
	return m, nil
}

// MaxChain bounds the parent chain Open follows (a guard against loops;
// compaction keeps real chains short).
const MaxChain = 4096

// ErrOutOfRange: a chunk index beyond the device.
var ErrOutOfRange = errors.New("chunk index out of range")

// Image is an opened generation: its manifest chain flattened into one
// index, so a read is one lookup and at most one object fetch.
type Image struct {
	repo  *Repo
	top   *Manifest
	chain []GenRef // top first
	where map[uint64]location
}

type location struct {
	vol  Volume
	kind EntryKind
	sum  [32]byte
	// pack is the key of the pack object holding the chunk ("": a loose
	// object), n bytes at off.
	pack   string
	off, n uint32
}

// locations returns a function that places m's entries (the pack keys
// built once per manifest).
func (m *Manifest) locations() func(Entry) location {
	keys := make([]string, len(m.Packs))
	for i, p := range m.Packs {
		keys[i] = packKey(m.Volume, p)
	}
	return func(e Entry) location {
		l := location{vol: m.Volume, kind: e.Kind, sum: e.Sum}
		if e.Pack != 0 {
			l.pack, l.off, l.n = keys[e.Pack-1], e.Offset, e.Length
		}
		return l
	}
}

// Open opens generation ref: it loads and checks every manifest of its
// parent chain (same chunk size all the way).
func (r *Repo) Open(ctx context.Context, ref GenRef) (*Image, error) {
	top, err := r.Manifest(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", ref, err)
	}
	chain := []*Manifest{top}
	seen := map[GenRef]bool{ref: true}
	for m := top; m.Parent != nil; {
		if len(chain) >= MaxChain {
			return nil, fmt.Errorf("open %s: %w: parent chain longer than %d", ref, ErrInvalidManifest, MaxChain)
		}
		if seen[*m.Parent] {
			return nil, fmt.Errorf("open %s: %w: parent chain loops at %s", ref, ErrCorrupt, *m.Parent)
		}
		seen[*m.Parent] = true
		p, err := r.Manifest(ctx, *m.Parent)
		if err != nil {
			return nil, fmt.Errorf("open %s: parent: %w", ref, err)
		}
		if p.ChunkSize != top.ChunkSize {
			return nil, fmt.Errorf("open %s: %w: parent %s has chunk size %d, not %d", ref, ErrInvalidManifest, p.Ref(), p.ChunkSize, top.ChunkSize)
		}
		chain = append(chain, p)
		m = p
	}
	im := &Image{repo: r, top: top, where: map[uint64]location{}}
	n := top.Chunks()
	// Oldest first, so newer generations overwrite.
	for i := len(chain) - 1; i >= 0; i-- {
		m := chain[i]
		at := m.locations()
		for _, e := range m.Entries {
			if e.Index < n { // a device that shrank drops the tail
				im.where[e.Index] = at(e)
			}
		}
	}
	for _, m := range chain {
		im.chain = append(im.chain, m.Ref())
	}
	return im, nil
}

// Manifest is the opened generation's own manifest.
func (im *Image) Manifest() *Manifest { return im.top }

// Chain is the opened generation and its ancestors, newest first.
func (im *Image) Chain() []GenRef { return append([]GenRef(nil), im.chain...) }

// ChunkSize is the chunk size in bytes.
func (im *Image) ChunkSize() int { return int(im.top.ChunkSize) }

// DeviceSize is the device size in bytes.
func (im *Image) DeviceSize() uint64 { return im.top.DeviceSize }

// Chunks is the number of chunks.
func (im *Image) Chunks() uint64 { return im.top.Chunks() }

// IsZero reports whether chunk i is known to be zeros without a fetch (a
// hole in this generation or an ancestor, or never written).
func (im *Image) IsZero(i uint64) bool {
	l, ok := im.where[i]
	return !ok || l.kind == EntryZero
}

// ReadChunk fills buf (ChunkSize bytes) with chunk i. A chunk object that
// is missing, tampered, truncated, swapped or sealed under another key is
// an error wrapping ErrCorrupt, and buf is then all zeros, never the
// object's bytes.
func (im *Image) ReadChunk(ctx context.Context, i uint64, buf []byte) error {
	if len(buf) != im.ChunkSize() {
		return fmt.Errorf("read chunk %d of %s: buffer of %d bytes, chunk size %d", i, im.top.Ref(), len(buf), im.ChunkSize())
	}
	if i >= im.Chunks() {
		return fmt.Errorf("read chunk %d of %s: %w (%d chunks)", i, im.top.Ref(), ErrOutOfRange, im.Chunks())
	}
	l, ok := im.where[i]
	if !ok || l.kind == EntryZero {
		clear(buf)
		return nil
	}
	if err := im.repo.readChunk(ctx, l, buf); err != nil {
		clear(buf)
		return fmt.Errorf("read chunk %d of %s: %w", i, im.top.Ref(), err)
	}
	return nil
}

func (r *Repo) readChunk(ctx context.Context, l location, buf []byte) error {
	v, sum := l.vol, l.sum
	// The AAD names the chunk object's key, loose or in a pack: a packed
	// chunk is the very object that would be stored at key.
	key := chunkKey(v, sum)
	var blob []byte
	var err error
	bg, pooled := r.store.(BufferGetter)
	rg, ranged := r.store.(RangeGetter)
	if l.pack != "" && !ranged {
		return fmt.Errorf("%s: in pack %s, and the store (%T) reads no ranges", key, l.pack, r.store)
	}
	if l.pack != "" || pooled {
		pooled = true
		bp, _ := r.blobs.Get().(*[]byte)
		if bp == nil {
			// Header, nonce and tag fit beside a whole chunk.
			b := make([]byte, 0, len(buf)+1024)
			bp = &b
		}
		if l.pack != "" {
			// l.n is bounded by the manifest's Check (MaxChunkObject).
			blob, err = rg.GetRange(ctx, l.pack, int64(l.off), int(l.n), (*bp)[:0])
		} else {
			blob, err = bg.GetBuffer(ctx, key, (*bp)[:0])
		}
		defer func() {
			if cap(blob) >= cap(*bp) {
				*bp = blob[:0]
			}
			r.blobs.Put(bp)
		}()
	} else {
		blob, err = r.store.Get(ctx, key)
	}
	if err != nil {
		if errors.Is(err, ErrNotFound) || l.pack != "" && errors.Is(err, io.ErrUnexpectedEOF) {
			// A committed generation names it: missing (or a pack cut
			// short) is lost data.
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return err
	}
	dk, err := r.keys.Get(ctx, v)
	if err != nil {
		return err
	}
	// Straight into buf: the caller clears it on any error below.
	payload, err := r.codec.openTo(dk, kindChunk, key, blob, buf, pooled)
	if err != nil && l.pack != "" {
		return fmt.Errorf("%w (in pack %s at %d, %d bytes)", err, l.pack, l.off, l.n)
	}
	if err != nil {
		return err
	}
	if len(payload) != len(buf) {
		return fmt.Errorf("%w: %s: %d bytes, chunk size %d", ErrCorrupt, key, len(payload), len(buf))
	}
	if &payload[0] != &buf[0] {
		copy(buf, payload)
	}
	// No keyed checksum of buf here: the object opened under the volume's
	// data key with its own name (which holds the sum the authenticated
	// manifest gave) in the AAD, so it is the object sealed for this sum,
	// and only a data-key holder can seal; one could forge the manifest
	// just as well. Recomputing the sum guards nothing more and cost 0.6 s
	// of CPU per GiB read (docs/architecture.md, "Block mode").
	return nil
}

// CommitSpec describes a new generation.
type CommitSpec struct {
	Generation GenRef
	// Parent is the generation it writes over; nil for a first
	// generation (a template import).
	Parent     *GenRef
	DeviceSize uint64
	// ChunkSize must equal the parent's; 0 means the parent's, or
	// DefaultChunkSize without a parent.
	ChunkSize uint32
	// Packed puts the chunks into pack objects (pack.go): one durable
	// write per pack, not per chunk. For generations whose chunks all
	// live as long as they do (a template's): GC frees whole packs. A
	// store that is no RangeGetter gets loose objects.
	Packed bool
}

// Commit writes chunks (index → ChunkSize bytes; nil or all zeros is a
// hole that hides the parent's chunk) as generation spec.Generation; see
// Writer. Every chunk is checked before anything is written, so bad input
// changes nothing. chunks is not modified.
func (r *Repo) Commit(ctx context.Context, spec CommitSpec, chunks map[uint64][]byte) (*Manifest, error) {
	m, err := r.planManifest(ctx, spec)
	if err != nil {
		return nil, err
	}
	for i, c := range chunks {
		if err := m.checkChunk(i, c); err != nil {
			return nil, fmt.Errorf("commit %s: %w", m.Ref(), err)
		}
	}
	w, err := r.newWriter(ctx, m, spec.Packed)
	if err != nil {
		return nil, err
	}
	for i, c := range chunks {
		if err := w.WriteChunk(ctx, i, c); err != nil {
			w.Abort()
			return nil, err
		}
	}
	return w.Commit(ctx)
}

// Writer writes one new generation chunk by chunk (a template import, an
// NBD writer's seal): WriteChunk seals and uploads in the background
// (bounded), Commit waits for every upload and then writes the manifest,
// so a crash or error before Commit returns leaves no visible generation,
// only unreferenced chunk objects (which a later commit of the same data
// reuses, as they are named by content). Not safe for concurrent use.
type Writer struct {
	// ctx bounds the background uploads: NewWriter's, which must live
	// until Commit or Abort (it is the commit's lifetime, not a call's).
	ctx  context.Context
	repo *Repo
	m    *Manifest
	dk   *DataKey
	// index → entry; a chunk written twice keeps the last.
	entries map[uint64]Entry
	// Chunks already uploaded (or in flight) in this generation.
	uploaded map[[32]byte]bool
	sem      chan struct{}
	// batch stages the chunks when the store is a Batcher: made durable
	// all at once by Commit, before the manifest.
	batch Batch
	// pk packs the chunks (CommitSpec.Packed; nil: loose objects).
	pk   *packState
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error // first upload error
	done bool
}

// NewWriter starts generation spec.Generation; ctx bounds its background
// uploads until Commit or Abort. It fails if the parent is
// missing or of another chunk size, or if the generation exists already
// (ErrExists: committed generations are never written over).
func (r *Repo) NewWriter(ctx context.Context, spec CommitSpec) (*Writer, error) {
	m, err := r.planManifest(ctx, spec)
	if err != nil {
		return nil, err
	}
	return r.newWriter(ctx, m, spec.Packed)
}

// planManifest validates spec into an empty manifest.
func (r *Repo) planManifest(ctx context.Context, spec CommitSpec) (*Manifest, error) {
	ref := spec.Generation
	m := &Manifest{Volume: ref.Volume, Generation: ref.Generation, DeviceSize: spec.DeviceSize, ChunkSize: spec.ChunkSize}
	if spec.Parent != nil {
		p, err := r.Manifest(ctx, *spec.Parent)
		if err != nil {
			return nil, fmt.Errorf("commit %s: parent: %w", ref, err)
		}
		if m.ChunkSize == 0 {
			m.ChunkSize = p.ChunkSize
		}
		if m.ChunkSize != p.ChunkSize {
			return nil, fmt.Errorf("commit %s: %w: chunk size %d, parent %s has %d", ref, ErrInvalidManifest, m.ChunkSize, p.Ref(), p.ChunkSize)
		}
		pp := *spec.Parent
		m.Parent = &pp
	} else if m.ChunkSize == 0 {
		m.ChunkSize = DefaultChunkSize
	}
	if err := m.Check(); err != nil {
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	return m, nil
}

func (m *Manifest) checkChunk(i uint64, c []byte) error {
	if i >= m.Chunks() {
		return fmt.Errorf("%w: chunk %d (%d chunks)", ErrOutOfRange, i, m.Chunks())
	}
	if c != nil && len(c) != int(m.ChunkSize) {
		return fmt.Errorf("chunk %d is %d bytes, chunk size %d", i, len(c), m.ChunkSize)
	}
	return nil
}

func (r *Repo) newWriter(ctx context.Context, m *Manifest, packed bool) (*Writer, error) {
	ref := m.Ref()
	// Refuse early; the manifest's create-once Put stays the authority
	// on a race.
	if _, err := r.store.Get(ctx, manifestKey(ref)); err == nil {
		return nil, fmt.Errorf("commit %s: %w", ref, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	dk, err := r.keys.Ensure(ctx, ref.Volume)
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	w := &Writer{
		ctx: ctx, repo: r, m: m, dk: dk,
		entries:  map[uint64]Entry{},
		uploaded: map[[32]byte]bool{},
		sem:      make(chan struct{}, r.uploads),
	}
	if _, ok := r.store.(RangeGetter); ok && packed {
		w.pk = newPackState(r.sealers)
	} else if b, ok := r.store.(Batcher); ok {
		w.batch = b.NewBatch()
	}
	return w, nil
}

// put uploads one chunk object: staged in the batch, or a durable Put.
func (w *Writer) put(key string, blob []byte) error {
	if w.batch != nil {
		return w.batch.Put(w.ctx, key, blob)
	}
	return w.repo.store.Put(w.ctx, key, blob)
}

// WriteChunk sets chunk i to data (ChunkSize bytes; nil or all zeros is a
// hole). The data is sealed before WriteChunk returns, so the caller may
// reuse its buffer; the upload runs in the background, and its error is
// returned by a later WriteChunk or by Commit.
func (w *Writer) WriteChunk(ctx context.Context, i uint64, data []byte) error {
	ref := w.m.Ref()
	if w.done {
		return fmt.Errorf("write chunk %d of %s: writer finished", i, ref)
	}
	if err := w.firstErr(); err != nil {
		return fmt.Errorf("commit %s: %w", ref, err)
	}
	if err := w.m.checkChunk(i, data); err != nil {
		return fmt.Errorf("commit %s: %w", ref, err)
	}
	if data == nil || allZero(data) {
		if w.m.Parent != nil {
			w.entries[i] = Entry{Index: i, Kind: EntryZero}
		} else {
			delete(w.entries, i) // without a parent, absent is zeros
		}
		return nil
	}
	s := w.dk.sum(data)
	if w.pk != nil {
		return w.writePacked(ctx, i, s, data)
	}
	w.entries[i] = Entry{Index: i, Kind: EntryData, Sum: s}
	if w.uploaded[s] {
		return nil
	}
	w.uploaded[s] = true
	key := chunkKey(w.dk.volume, s)
	blob, err := w.repo.codec.seal(w.dk, kindChunk, key, data)
	if err != nil {
		return fmt.Errorf("commit %s: %w", ref, err)
	}
	select {
	case w.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("commit %s: %w", ref, ctx.Err())
	}
	w.wg.Add(1)
	go func() {
		defer func() { <-w.sem; w.wg.Done() }()
		// ErrExists: the same content is stored already (named by its
		// keyed checksum); a damaged copy is caught when read.
		if err := w.put(key, blob); err != nil && !errors.Is(err, ErrExists) {
			w.setErr(fmt.Errorf("put chunk %s: %w", key, err))
		}
	}()
	return nil
}

func (w *Writer) firstErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Commit waits for the uploads, then writes the manifest: from that
// moment the generation exists, whole. An error leaves no generation
// (ErrExists: another writer committed it first, and theirs stands).
func (w *Writer) Commit(ctx context.Context) (*Manifest, error) {
	ref := w.m.Ref()
	if w.done {
		return nil, fmt.Errorf("commit %s: writer finished", ref)
	}
	w.done = true
	if w.pk != nil {
		w.pk.sealing.Wait()
		if w.pk.cur != nil {
			if err := w.closePack(ctx); err != nil {
				w.Abort()
				return nil, err
			}
		}
	}
	w.wg.Wait()
	if err := w.firstErr(); err != nil {
		w.abortBatch()
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	if err := ctx.Err(); err != nil {
		w.abortBatch()
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	// Every chunk durable before the manifest names it: a crash before
	// the manifest's Put leaves no generation (and the old head).
	if w.batch != nil {
		if err := w.batch.Commit(ctx); err != nil {
			return nil, fmt.Errorf("commit %s: chunks: %w", ref, err)
		}
	}
	m := *w.m
	if w.pk != nil {
		m.Packs = w.pk.ids
	}
	m.Entries = make([]Entry, 0, len(w.entries))
	for _, e := range w.entries {
		if w.pk != nil && e.Kind == EntryData {
			var err error
			if e, err = w.pk.place(e); err != nil {
				return nil, fmt.Errorf("commit %s: %w", ref, err)
			}
		}
		m.Entries = append(m.Entries, e)
	}
	sortEntries(m.Entries)
	enc, err := m.Encode()
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	blob, err := w.repo.codec.seal(w.dk, kindManifest, manifestKey(ref), enc)
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", ref, err)
	}
	if err := w.repo.store.Put(ctx, manifestKey(ref), blob); err != nil {
		return nil, fmt.Errorf("commit %s: manifest: %w", ref, err)
	}
	return &m, nil
}

// Abort ends the writer without a generation; it waits for the uploads in
// flight (their objects stay, unreferenced; a Batcher's staged ones go).
func (w *Writer) Abort() {
	w.done = true
	if w.pk != nil {
		w.pk.sealing.Wait()
	}
	w.wg.Wait()
	w.abortBatch()
	if w.pk != nil && w.pk.cur != nil {
		w.pk.cur.Abort()
		w.pk.cur = nil
	}
}

func (w *Writer) abortBatch() {
	if w.batch != nil {
		w.batch.Abort()
	}
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// ChunkObject says where chunk i's sealed object is stored: the object's
// key and, for a chunk in a pack, its byte range there (length -1: the
// whole object, a loose chunk); ok is false for a zero chunk. For tools
// and tests that inspect or damage the store.
func (im *Image) ChunkObject(i uint64) (key string, off, length int64, ok bool) {
	l, found := im.where[i]
	switch {
	case !found || l.kind == EntryZero:
		return "", 0, 0, false
	case l.pack != "":
		return l.pack, int64(l.off), int64(l.n), true
	}
	return chunkKey(l.vol, l.sum), 0, -1, true
}
