package blockstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
)

const cs = 16 << 10 // small chunks keep the tests quick

// compressions are the settings a repo takes.
var compressions = []blockstore.Compression{blockstore.CompressNone, blockstore.CompressS2, blockstore.CompressZstd}

type fixture struct {
	dir   *dirstore.Store
	store blockstore.Store
	node  *blockstore.NodeKey
	repo  *blockstore.Repo
}

func newFixture(t *testing.T, opts blockstore.Options) *fixture {
	t.Helper()
	ds, err := dirstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	r, err := blockstore.New(ds, nk, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: ds, store: ds, node: nk, repo: r}
}

func randChunk(t testing.TB) []byte {
	b := make([]byte, cs)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// readAll reads every chunk of ref into one device image.
func readAll(t *testing.T, r *blockstore.Repo, ref blockstore.GenRef) []byte {
	t.Helper()
	im, err := r.Open(context.Background(), ref)
	if err != nil {
		t.Fatalf("Open(%s): %v", ref, err)
	}
	dev := make([]byte, im.DeviceSize())
	for i := uint64(0); i < im.Chunks(); i++ {
		if err := im.ReadChunk(context.Background(), i, dev[i*cs:(i+1)*cs]); err != nil {
			t.Fatalf("ReadChunk(%d) of %s: %v", i, ref, err)
		}
	}
	return dev
}

var (
	tpl0 = blockstore.GenRef{Volume: blockstore.Template("busybox"), Generation: 0}
	sb1  = blockstore.GenRef{Volume: blockstore.Sandbox("sb-1"), Generation: 1}
	sb2  = blockstore.GenRef{Volume: blockstore.Sandbox("sb-1"), Generation: 2}
)

// A template generation, a sandbox generation over it and one over that:
// each reads as the device written so far, zero chunks are holes (no
// object), a trimmed chunk reads as zeros, not as the base.
func TestCommitAndReadChain(t *testing.T) {
	for _, compress := range compressions {
		f := newFixture(t, blockstore.Options{Compression: compress})
		ctx := context.Background()
		const n = 8
		want := make([]byte, n*cs)
		base := map[uint64][]byte{}
		for _, i := range []uint64{0, 1, 2, 5} {
			c := randChunk(t)
			base[i] = c
			copy(want[i*cs:], c)
		}
		base[3] = make([]byte, cs) // explicit zeros: a hole
		text := bytes.Repeat([]byte("compressible"), cs/12+1)[:cs]
		base[6] = text
		copy(want[6*cs:], text)
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: n * cs, ChunkSize: cs}, base); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, f.repo, tpl0); !bytes.Equal(got, want) {
			t.Fatal("template generation reads back different")
		}
		if objs := listChunks(t, f.store, tpl0.Volume); len(objs) != 5 {
			t.Fatalf("template has %d chunk objects, want 5 (zero chunks are holes)", len(objs))
		}

		// Generation 1 of the sandbox: chunk 1 rewritten, chunk 2 trimmed,
		// chunk 7 written for the first time.
		g1 := want
		want = bytes.Clone(g1)
		c1, c7 := randChunk(t), randChunk(t)
		copy(want[1*cs:], c1)
		clear(want[2*cs : 3*cs])
		copy(want[7*cs:], c7)
		m, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: n * cs},
			map[uint64][]byte{1: c1, 2: nil, 7: c7})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Entries) != 3 || m.Entries[1].Kind != blockstore.EntryZero || m.ChunkSize != cs {
			t.Fatalf("sandbox manifest %+v", m)
		}
		if got := readAll(t, f.repo, sb1); !bytes.Equal(got, want) {
			t.Fatal("sandbox generation 1 reads back different")
		}
		// The base is untouched by the child.
		if got := readAll(t, f.repo, tpl0); !bytes.Equal(got, g1) {
			t.Fatal("template changed under its child")
		}

		// Generation 2 grows the device and rewrites chunk 2 again.
		c2 := randChunk(t)
		want = append(want, make([]byte, 2*cs)...)
		copy(want[2*cs:], c2)
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: sb2, Parent: &sb1, DeviceSize: 10 * cs}, map[uint64][]byte{2: c2}); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, f.repo, sb2); !bytes.Equal(got, want) {
			t.Fatal("sandbox generation 2 reads back different")
		}
		im, _ := f.repo.Open(ctx, sb2)
		if ch := im.Chain(); len(ch) != 3 || ch[0] != sb2 || ch[2] != tpl0 {
			t.Fatalf("chain %v", ch)
		}
		if !im.IsZero(3) || im.IsZero(2) || !im.IsZero(9) {
			t.Fatal("IsZero wrong")
		}
		if err := im.ReadChunk(ctx, 10, make([]byte, cs)); !errors.Is(err, blockstore.ErrOutOfRange) {
			t.Fatalf("read past the device: %v", err)
		}
		gens, err := f.repo.Generations(ctx, sb1.Volume)
		if err != nil || len(gens) != 2 || gens[0] != 1 || gens[1] != 2 {
			t.Fatalf("Generations = %v, %v", gens, err)
		}
	}
}

func listChunks(t *testing.T, s blockstore.Store, v blockstore.Volume) []string {
	t.Helper()
	keys, err := s.List(context.Background(), v.String()+"/chunks/")
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// Reads take what each object says, not the repo's setting: a chain
// written by three repos over one store (the template with zstd, a
// sandbox generation with S2, the next without compression) reads back
// exact through a repo set to each of none, S2 and zstd.
func TestReadsTakeWhatEachObjectSays(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, blockstore.Options{})
	repo := func(c blockstore.Compression) *blockstore.Repo {
		r, err := blockstore.New(f.store, f.node, blockstore.Options{Compression: c})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	text := func(seed int) []byte {
		var b []byte
		for i := 0; len(b) < cs; i++ {
			b = fmt.Appendf(b, "line %d of chunk %d\n", i, seed)
		}
		return b[:cs]
	}
	const n = 4
	want := map[blockstore.GenRef][]byte{}
	dev := make([]byte, n*cs)
	for _, g := range []struct {
		ref    blockstore.GenRef
		parent *blockstore.GenRef
		by     blockstore.Compression
		chunks map[uint64][]byte
	}{
		{tpl0, nil, blockstore.CompressZstd, map[uint64][]byte{0: text(0), 1: text(1), 3: randChunk(t)}},
		{sb1, &tpl0, blockstore.CompressS2, map[uint64][]byte{1: text(2), 2: text(3)}},
		{sb2, &sb1, blockstore.CompressNone, map[uint64][]byte{2: text(4)}},
	} {
		if _, err := repo(g.by).Commit(ctx, blockstore.CommitSpec{Generation: g.ref, Parent: g.parent, DeviceSize: n * cs, ChunkSize: cs}, g.chunks); err != nil {
			t.Fatal(err)
		}
		dev = bytes.Clone(dev)
		for i, c := range g.chunks {
			copy(dev[i*cs:], c)
		}
		want[g.ref] = dev
	}
	// The flags byte of each chunk object: the writers' settings took.
	flags := map[blockstore.Volume]map[byte]int{}
	for _, v := range []blockstore.Volume{tpl0.Volume, sb1.Volume} {
		flags[v] = map[byte]int{}
		for _, k := range listChunks(t, f.store, v) {
			b, err := os.ReadFile(objFile(f, k))
			if err != nil {
				t.Fatal(err)
			}
			flags[v][b[6]]++
		}
	}
	if fmt.Sprint(flags[tpl0.Volume]) != "map[0:1 1:2]" || fmt.Sprint(flags[sb1.Volume]) != "map[0:1 2:2]" {
		t.Fatalf("chunk objects' flags: template %v, sandbox %v; want zstd (1) twice and one raw (0), S2 (2) twice and one raw", flags[tpl0.Volume], flags[sb1.Volume])
	}
	for _, c := range compressions {
		r := repo(c)
		for _, ref := range []blockstore.GenRef{tpl0, sb1, sb2} {
			if got := readAll(t, r, ref); !bytes.Equal(got, want[ref]) {
				t.Fatalf("%s read by a repo set to %s: other bytes", ref, c)
			}
		}
	}
}

// Identical chunks are one object (named by the keyed checksum).
func TestCommitDedups(t *testing.T) {
	f := newFixture(t, blockstore.Options{})
	c := randChunk(t)
	if _, err := f.repo.Commit(context.Background(), blockstore.CommitSpec{Generation: tpl0, DeviceSize: 4 * cs, ChunkSize: cs},
		map[uint64][]byte{0: c, 1: c, 3: c}); err != nil {
		t.Fatal(err)
	}
	if objs := listChunks(t, f.store, tpl0.Volume); len(objs) != 1 {
		t.Fatalf("%d objects for one distinct chunk", len(objs))
	}
}

// Invariant 4: a committed generation is never replaced; a second commit
// of it (a stale writer) is ErrExists and the first stays readable.
func TestCommitExistingGenerationRefused(t *testing.T) {
	f := newFixture(t, blockstore.Options{})
	ctx := context.Background()
	first := map[uint64][]byte{0: randChunk(t)}
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 2 * cs, ChunkSize: cs}, first); err != nil {
		t.Fatal(err)
	}
	_, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 2 * cs, ChunkSize: cs}, map[uint64][]byte{0: randChunk(t)})
	if !errors.Is(err, blockstore.ErrExists) {
		t.Fatalf("second commit = %v, want ErrExists", err)
	}
	if got := readAll(t, f.repo, tpl0); !bytes.Equal(got[:cs], first[0]) {
		t.Fatal("committed generation changed")
	}
}

func TestCommitRefusesBadInput(t *testing.T) {
	f := newFixture(t, blockstore.Options{})
	ctx := context.Background()
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 2 * cs, ChunkSize: cs}, nil); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		spec   blockstore.CommitSpec
		chunks map[uint64][]byte
	}{
		"short chunk":       {blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: 2 * cs}, map[uint64][]byte{0: make([]byte, cs-1)}},
		"beyond device":     {blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: 2 * cs}, map[uint64][]byte{2: randChunk(t)}},
		"chunk size change": {blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: 4 * cs, ChunkSize: 2 * cs}, nil},
		"missing parent":    {blockstore.CommitSpec{Generation: sb2, Parent: &sb1, DeviceSize: 2 * cs}, nil},
		"unaligned size":    {blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: 2*cs + 1}, nil},
		"bad volume":        {blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: blockstore.Sandbox("../x"), Generation: 1}, DeviceSize: cs, ChunkSize: cs}, nil},
	} {
		if _, err := f.repo.Commit(ctx, c.spec, c.chunks); err == nil {
			t.Errorf("%s: commit succeeded", name)
		}
	}
	// Nothing of the refused commits is visible.
	if gens, _ := f.repo.Generations(ctx, sb1.Volume); len(gens) != 0 {
		t.Fatalf("refused commits left generations %v", gens)
	}
	if keys, _ := f.store.List(ctx, "sandboxes/"); len(keys) != 0 {
		t.Fatalf("refused commits left objects %v", keys)
	}
}

// failingStore fails every Put after the first `after`.
type failingStore struct {
	blockstore.Store
	after int64
	puts  atomic.Int64
}

func (s *failingStore) Put(ctx context.Context, key string, data []byte) error {
	if s.puts.Add(1) > s.after {
		return errors.New("injected: disk full")
	}
	return s.Store.Put(ctx, key, data)
}

// A commit that dies part way (here: a failing Put) leaves no visible
// generation; a retry of the same commit then succeeds, reusing the chunk
// objects already written.
func TestFailedCommitLeavesNoGeneration(t *testing.T) {
	f := newFixture(t, blockstore.Options{Uploads: 1})
	ctx := context.Background()
	chunks := map[uint64][]byte{}
	for i := range uint64(6) {
		chunks[i] = randChunk(t)
	}
	// Puts: the data key (first attempt only), the 6 chunks, the manifest;
	// the last case fails only the manifest.
	for _, after := range []int64{0, 1, 3, 6} {
		fs := &failingStore{Store: f.store, after: after}
		r, err := blockstore.New(fs, f.node, blockstore.Options{Uploads: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 6 * cs, ChunkSize: cs}, chunks); err == nil {
			t.Fatalf("commit with Puts failing after %d succeeded", after)
		}
		if _, err := f.repo.Open(ctx, tpl0); !errors.Is(err, blockstore.ErrNotFound) {
			t.Fatalf("after a failed commit (puts failing after %d) Open = %v, want ErrNotFound", after, err)
		}
	}
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 6 * cs, ChunkSize: cs}, chunks); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, f.repo, tpl0)
	for i, c := range chunks {
		if !bytes.Equal(got[i*cs:(i+1)*cs], c) {
			t.Fatalf("chunk %d differs after the retried commit", i)
		}
	}
}

// objFile is the dirstore file of a key.
func objFile(f *fixture, key string) string {
	return filepath.Join(f.dir.Root(), filepath.FromSlash(key))
}

func rewrite(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A tampered, truncated, swapped or missing object is a read error that
// wraps ErrCorrupt, and the buffer holds zeros, never the object's bytes.
func TestTamperedObjectsAreReadErrors(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*fixture, []string, map[uint64][]byte) {
		f := newFixture(t, blockstore.Options{Compression: blockstore.CompressS2})
		chunks := map[uint64][]byte{0: randChunk(t), 1: randChunk(t)}
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 2 * cs, ChunkSize: cs}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: 2 * cs}, chunks); err != nil {
			t.Fatal(err)
		}
		objs := listChunks(t, f.store, sb1.Volume)
		if len(objs) != 2 {
			t.Fatalf("%d objects", len(objs))
		}
		return f, objs, chunks
	}
	// expectBad opens sb1 and reads both chunks: at least one must fail
	// with ErrCorrupt and no read may return wrong data.
	expectBad := func(t *testing.T, f *fixture, chunks map[uint64][]byte) {
		t.Helper()
		im, err := f.repo.Open(ctx, sb1)
		if err != nil {
			t.Fatal(err)
		}
		failed := 0
		for i := range uint64(2) {
			buf := bytes.Repeat([]byte{0xAA}, cs)
			err := im.ReadChunk(ctx, i, buf)
			switch {
			case err == nil && !bytes.Equal(buf, chunks[i]):
				t.Fatalf("chunk %d: wrong data without an error", i)
			case err != nil && !errors.Is(err, blockstore.ErrCorrupt):
				t.Fatalf("chunk %d: error %v does not wrap ErrCorrupt", i, err)
			case err != nil && !bytes.Equal(buf, make([]byte, cs)):
				t.Fatalf("chunk %d: failed read left non-zero bytes in the buffer", i)
			case err != nil:
				failed++
			}
		}
		if failed == 0 {
			t.Fatal("tampering was not detected")
		}
	}
	t.Run("flip", func(t *testing.T) {
		f, objs, chunks := setup(t)
		for _, off := range []int{0, 5, 12, 40, cs / 2, -1} {
			f2, objs2, chunks2 := f, objs, chunks
			if off != 0 {
				f2, objs2, chunks2 = setup(t)
			}
			rewrite(t, objFile(f2, objs2[0]), func(b []byte) []byte {
				i := off
				if i < 0 || i >= len(b) {
					i = len(b) - 1
				}
				b[i] ^= 0x01
				return b
			})
			expectBad(t, f2, chunks2)
		}
	})
	t.Run("truncate", func(t *testing.T) {
		for _, keep := range []int{0, 3, 20, -16, -1} {
			f, objs, chunks := setup(t)
			rewrite(t, objFile(f, objs[1]), func(b []byte) []byte {
				if keep < 0 {
					return b[:len(b)+keep]
				}
				return b[:keep]
			})
			expectBad(t, f, chunks)
		}
	})
	t.Run("swap within the volume", func(t *testing.T) {
		f, objs, chunks := setup(t)
		a, _ := os.ReadFile(objFile(f, objs[0]))
		b, _ := os.ReadFile(objFile(f, objs[1]))
		os.WriteFile(objFile(f, objs[0]), b, 0o600)
		os.WriteFile(objFile(f, objs[1]), a, 0o600)
		expectBad(t, f, chunks)
	})
	t.Run("swap between sandboxes", func(t *testing.T) {
		f, objs, chunks := setup(t)
		other := blockstore.GenRef{Volume: blockstore.Sandbox("sb-2"), Generation: 1}
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: other, Parent: &tpl0, DeviceSize: 2 * cs}, map[uint64][]byte{0: randChunk(t)}); err != nil {
			t.Fatal(err)
		}
		foreign, _ := os.ReadFile(objFile(f, listChunks(t, f.store, other.Volume)[0]))
		os.WriteFile(objFile(f, objs[0]), foreign, 0o600)
		expectBad(t, f, chunks)
	})
	t.Run("missing", func(t *testing.T) {
		f, objs, chunks := setup(t)
		if err := f.store.Delete(ctx, objs[0]); err != nil {
			t.Fatal(err)
		}
		expectBad(t, f, chunks)
	})
	t.Run("manifest flip or swap", func(t *testing.T) {
		f, _, _ := setup(t)
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: sb2, Parent: &sb1, DeviceSize: 2 * cs}, map[uint64][]byte{0: nil}); err != nil {
			t.Fatal(err)
		}
		m1 := objFile(f, "sandboxes/sb-1/gen/00000000000000000001")
		m2 := objFile(f, "sandboxes/sb-1/gen/00000000000000000002")
		a, _ := os.ReadFile(m1)
		b, _ := os.ReadFile(m2)
		os.WriteFile(m2, a, 0o600) // generation 1's manifest posing as 2
		if _, err := f.repo.Open(ctx, sb2); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("swapped manifest: Open = %v", err)
		}
		b[len(b)-3] ^= 0x40
		os.WriteFile(m2, b, 0o600)
		if _, err := f.repo.Open(ctx, sb2); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("flipped manifest: Open = %v", err)
		}
	})
	t.Run("wrapped key", func(t *testing.T) {
		f, _, _ := setup(t)
		rewrite(t, objFile(f, "sandboxes/sb-1/key"), func(b []byte) []byte { b[len(b)-1] ^= 1; return b })
		// A fresh repo: no key cached.
		r, _ := blockstore.New(f.store, f.node, blockstore.Options{})
		if _, err := r.Open(ctx, sb1); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("tampered wrapped key: Open = %v", err)
		}
	})
}

// Another node key cannot read the store: the data keys are wrapped.
func TestOtherNodeKeyCannotRead(t *testing.T) {
	f := newFixture(t, blockstore.Options{})
	ctx := context.Background()
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: cs, ChunkSize: cs}, map[uint64][]byte{0: randChunk(t)}); err != nil {
		t.Fatal(err)
	}
	other, _, _ := blockstore.GenerateNodeKey("node-b")
	r, _ := blockstore.New(f.store, other, blockstore.Options{})
	if _, err := r.Open(ctx, tpl0); !errors.Is(err, blockstore.ErrWrongNodeKey) {
		t.Fatalf("Open with another node key = %v", err)
	}
	// Nothing in the store holds a chunk's plaintext.
	keys, _ := f.store.List(ctx, "")
	for _, k := range keys {
		if strings.Contains(k, "chunks/") {
			b, _ := f.store.Get(ctx, k)
			if len(b) < cs {
				t.Fatalf("object %s shorter than the chunk: %d", k, len(b))
			}
		}
	}
}

// The streaming writer: a rewritten index keeps the last data, the caller
// may reuse its buffer at once, and nothing is visible before Commit.
func TestWriterStreams(t *testing.T) {
	f := newFixture(t, blockstore.Options{Uploads: 2})
	ctx := context.Background()
	w, err := f.repo.NewWriter(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 64 * cs, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 64*cs)
	buf := make([]byte, cs)
	for i := range uint64(64) {
		rand.Read(buf)
		if err := w.WriteChunk(ctx, i, buf); err != nil {
			t.Fatal(err)
		}
		copy(want[i*cs:], buf)
	}
	rand.Read(buf) // rewrite chunk 5, then zero chunk 6
	if err := w.WriteChunk(ctx, 5, buf); err != nil {
		t.Fatal(err)
	}
	copy(want[5*cs:], buf)
	if err := w.WriteChunk(ctx, 6, nil); err != nil {
		t.Fatal(err)
	}
	clear(want[6*cs : 7*cs])
	clear(buf) // the writer sealed its copy already
	if gens, _ := f.repo.Generations(ctx, tpl0.Volume); len(gens) != 0 {
		t.Fatalf("generation visible before Commit: %v", gens)
	}
	if _, err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f.repo, tpl0); !bytes.Equal(got, want) {
		t.Fatal("streamed generation reads back different")
	}
	if err := w.WriteChunk(ctx, 0, buf); err == nil {
		t.Fatal("WriteChunk after Commit succeeded")
	}
	if _, err := w.Commit(ctx); err == nil {
		t.Fatal("second Commit succeeded")
	}
	if _, err := f.repo.NewWriter(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: cs, ChunkSize: cs}); !errors.Is(err, blockstore.ErrExists) {
		t.Fatalf("NewWriter of a committed generation = %v, want ErrExists", err)
	}
}

// An upload error surfaces (in WriteChunk or Commit) and no generation
// appears; Abort leaves none either.
func TestWriterErrorAndAbort(t *testing.T) {
	f := newFixture(t, blockstore.Options{Uploads: 1})
	ctx := context.Background()
	fs := &failingStore{Store: f.store, after: 3}
	r, _ := blockstore.New(fs, f.node, blockstore.Options{Uploads: 1})
	w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 8 * cs, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	for i := range uint64(8) {
		if werr = w.WriteChunk(ctx, i, randChunk(t)); werr != nil {
			break
		}
	}
	if _, err := w.Commit(ctx); err == nil || (werr == nil && !strings.Contains(err.Error(), "injected")) {
		t.Fatalf("Commit after failed uploads = %v (WriteChunk: %v)", err, werr)
	}
	if _, err := f.repo.Open(ctx, tpl0); !errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("Open after a failed commit = %v, want ErrNotFound", err)
	}
	w2, err := f.repo.NewWriter(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 8 * cs, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.WriteChunk(ctx, 0, randChunk(t)); err != nil {
		t.Fatal(err)
	}
	w2.Abort()
	if _, err := f.repo.Open(ctx, tpl0); !errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("Open after Abort = %v, want ErrNotFound", err)
	}
}

// chunkFailStore fails the Put of one chunk object and lets the manifest
// through: only the order of Commit keeps the generation invisible.
type chunkFailStore struct {
	blockstore.Store
	chunkPuts atomic.Int64
	failNth   int64
}

func (s *chunkFailStore) Put(ctx context.Context, key string, data []byte) error {
	if strings.Contains(key, "/chunks/") && s.chunkPuts.Add(1) == s.failNth {
		return errors.New("injected: chunk upload failed")
	}
	return s.Store.Put(ctx, key, data)
}

// The manifest is written only after every chunk upload succeeded: a
// failed chunk upload with a working manifest Put still leaves no
// generation.
func TestManifestWrittenAfterAllChunks(t *testing.T) {
	for _, nth := range []int64{1, 4, 8} {
		f := newFixture(t, blockstore.Options{})
		ctx := context.Background()
		cf := &chunkFailStore{Store: f.store, failNth: nth}
		r, _ := blockstore.New(cf, f.node, blockstore.Options{Uploads: 4})
		chunks := map[uint64][]byte{}
		for i := range uint64(8) {
			chunks[i] = randChunk(t)
		}
		if _, err := r.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 8 * cs, ChunkSize: cs}, chunks); err == nil {
			t.Fatalf("commit with chunk upload %d failing succeeded", nth)
		}
		if _, err := f.repo.Open(ctx, tpl0); !errors.Is(err, blockstore.ErrNotFound) {
			t.Fatalf("chunk upload %d failed, yet Open = %v, want ErrNotFound", nth, err)
		}
	}
}

// An Image serves concurrent readers (the NBD server reads in parallel);
// run with -race.
func TestImageConcurrentReads(t *testing.T) {
	f := newFixture(t, blockstore.Options{Compression: blockstore.CompressS2})
	ctx := context.Background()
	chunks := map[uint64][]byte{}
	for i := range uint64(16) {
		chunks[i] = randChunk(t)
	}
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 32 * cs, ChunkSize: cs}, chunks); err != nil {
		t.Fatal(err)
	}
	// A fresh repo, so the data key is loaded by the racing readers.
	r, _ := blockstore.New(f.store, f.node, blockstore.Options{})
	im, err := r.Open(ctx, tpl0)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			buf := make([]byte, cs)
			for n := range 64 {
				i := uint64((g*7 + n) % 32)
				if err := im.ReadChunk(ctx, i, buf); err != nil {
					errs <- err
					return
				}
				want := chunks[i]
				if want == nil {
					want = make([]byte, cs)
				}
				if !bytes.Equal(buf, want) {
					errs <- fmt.Errorf("chunk %d differs", i)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// The read path decrypts into the caller's buffer and reuses its object
// buffers (dirstore's GetBuffer): a compressed chunk (S2 or zstd) flipped
// anywhere is still ErrCorrupt with a zeroed buffer, reads of intact
// chunks around it (through the same recycled buffers) stay exact, and a
// read of the damaged chunk never leaks a neighbour's bytes.
func TestPooledReadPathTamperedCompressedChunk(t *testing.T) {
	for _, c := range []blockstore.Compression{blockstore.CompressS2, blockstore.CompressZstd} {
		t.Run(string(c), func(t *testing.T) { testPooledReadPathTampered(t, c) })
	}
}

func testPooledReadPathTampered(t *testing.T, c blockstore.Compression) {
	ctx := context.Background()
	text := func(seed byte) []byte {
		b := make([]byte, cs)
		for i := range b {
			b[i] = "abcdefgh"[i%8] + seed // compressible: stored compressed
		}
		return b
	}
	chunks := map[uint64][]byte{0: text(0), 1: text(1), 2: randChunk(t)}
	for _, off := range []int{0, 5, 40, 60, -20, -1} {
		f := newFixture(t, blockstore.Options{Compression: c})
		if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 3 * cs, ChunkSize: cs}, chunks); err != nil {
			t.Fatal(err)
		}
		im, err := f.repo.Open(ctx, tpl0)
		if err != nil {
			t.Fatal(err)
		}
		// Find chunk 1's object by content (named by its keyed sum).
		var bad string
		for _, k := range listChunks(t, f.store, tpl0.Volume) {
			if b, _ := os.ReadFile(objFile(f, k)); len(b) < cs/2 {
				if bad == "" || k < bad {
					bad = k
				}
			}
		}
		if bad == "" {
			t.Fatal("no compressed object stored")
		}
		rewrite(t, objFile(f, bad), func(b []byte) []byte {
			i := off
			if i < 0 {
				i += len(b)
			}
			b[i] ^= 0x40
			return b
		})
		failed := 0
		for round := 0; round < 3; round++ {
			for _, i := range []uint64{0, 1, 2} {
				buf := bytes.Repeat([]byte{0xAA}, cs)
				err := im.ReadChunk(ctx, i, buf)
				switch {
				case err == nil && !bytes.Equal(buf, chunks[i]):
					t.Fatalf("flip at %d: chunk %d: wrong data without an error", off, i)
				case err != nil && !errors.Is(err, blockstore.ErrCorrupt):
					t.Fatalf("flip at %d: chunk %d: %v, want ErrCorrupt", off, i, err)
				case err != nil && !bytes.Equal(buf, make([]byte, cs)):
					t.Fatalf("flip at %d: chunk %d: failed read left bytes in the buffer", off, i)
				case err != nil:
					failed++
				}
			}
		}
		if failed != 3 {
			t.Fatalf("flip at %d: %d failed reads over 3 rounds, want 3 (one damaged chunk)", off, failed)
		}
	}
}

// A chunk read writes only its buffer: a caller reading chunks into
// adjacent parts of one buffer (concurrently, as cowdev does) never finds
// bytes past it touched, also by a zstd or S2 decode that could use spare
// capacity as scratch.
func TestReadChunkWritesOnlyBuf(t *testing.T) {
	for _, c := range []blockstore.Compression{blockstore.CompressS2, blockstore.CompressZstd} {
		t.Run(string(c), func(t *testing.T) { testReadChunkWritesOnlyBuf(t, c) })
	}
}

func testReadChunkWritesOnlyBuf(t *testing.T, c blockstore.Compression) {
	ctx := context.Background()
	f := newFixture(t, blockstore.Options{Compression: c})
	chunks := map[uint64][]byte{}
	for i := range uint64(4) {
		b := make([]byte, cs)
		for j := range b {
			// Compressible, with short matches (copies, literals).
			b[j] = "the quick brown fox "[(j*int(i+3))%20] ^ byte(j>>9)
		}
		chunks[i] = b
	}
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: 4 * cs, ChunkSize: cs}, chunks); err != nil {
		t.Fatal(err)
	}
	im, err := f.repo.Open(ctx, tpl0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(4) {
		big := bytes.Repeat([]byte{0xAA}, 2*cs)
		if err := im.ReadChunk(ctx, i, big[:cs]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(big[:cs], chunks[i]) {
			t.Fatalf("chunk %d: wrong data", i)
		}
		if !bytes.Equal(big[cs:], bytes.Repeat([]byte{0xAA}, cs)) {
			n := 0
			for n < cs && big[cs+n] != 0xAA {
				n++
			}
			t.Fatalf("chunk %d: ReadChunk wrote past its buffer (from byte %d on)", i, n)
		}
	}
}
