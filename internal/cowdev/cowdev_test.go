package cowdev_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/testutil"
)

const cs = 16 << 10 // small chunks keep the tests quick

var tpl0 = blockstore.GenRef{Volume: blockstore.Template("base"), Generation: 0}

type fixture struct {
	root string // the dirstore's directory
	repo *blockstore.Repo
	base []byte // the template image
}

// newFixture commits a template of chunks chunks (random data, zero chunks
// as holes, some chunks partly zero) as tpl0.
func newFixture(t testing.TB, chunks int) *fixture {
	t.Helper()
	root := t.TempDir()
	ds, err := dirstore.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(ds, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := pattern(int64(chunks)*cs, 7)
	commit(t, repo, blockstore.CommitSpec{Generation: tpl0, DeviceSize: uint64(len(base)), ChunkSize: cs}, base)
	return &fixture{root: root, repo: repo, base: base}
}

// pattern is a deterministic image: random data, every third chunk zeros,
// every fifth chunk half zeros.
func pattern(size int64, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, size)
	for off := int64(0); off < size; off += cs {
		c := b[off : off+cs]
		switch (off / cs) % 15 {
		case 0, 3, 6, 9, 12:
			continue
		}
		for i := range c {
			c[i] = byte(rng.Uint32())
		}
		if (off/cs)%5 == 0 {
			clear(c[cs/2:])
		}
	}
	return b
}

func commit(t testing.TB, repo *blockstore.Repo, spec blockstore.CommitSpec, img []byte) {
	t.Helper()
	chunks := map[uint64][]byte{}
	for i := 0; i*cs < len(img); i++ {
		chunks[uint64(i)] = img[i*cs : (i+1)*cs]
	}
	if _, err := repo.Commit(context.Background(), spec, chunks); err != nil {
		t.Fatal(err)
	}
}

func open(t testing.TB, f *fixture, base blockstore.GenRef, dir string) *cowdev.Device {
	t.Helper()
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: base, Dir: dir})
	if err != nil {
		t.Fatalf("Open(%s): %v", base, err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// chunkObjects lists the chunk objects' files under the dirstore root.
func chunkObjects(t testing.TB, root string) []string {
	t.Helper()
	var objs []string
	_ = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && strings.Contains(p, "/chunks/") {
			objs = append(objs, p)
		}
		return nil
	})
	if len(objs) == 0 {
		t.Fatal("no chunk objects")
	}
	return objs
}

// tamper flips a bit in the middle of each file.
func tamper(t testing.TB, files ...string) {
	t.Helper()
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func readAll(t testing.TB, d *cowdev.Device) []byte {
	t.Helper()
	size, _ := d.Size()
	b := make([]byte, size)
	if _, err := d.ReadAt(b, 0); err != nil {
		t.Fatalf("ReadAt: %v", err)
	}
	return b
}

func same(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: differs first at byte %d (chunk %d): got %#x want %#x", what, i, i/cs, got[i], want[i])
	}
}

// Random writes, trims and zeroings of any alignment, checked against a
// model after every step, then after Sync, Close and a re-open; with the
// chunks of a read fetched concurrently and inline (LocalStore).
func TestMatchesModel(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) { matchesModel(t, local) })
	}
}

func matchesModel(t *testing.T, local bool) {
	f := newFixture(t, 40)
	dir := t.TempDir()
	open := func(t testing.TB, f *fixture, base blockstore.GenRef, dir string) *cowdev.Device {
		t.Helper()
		d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: base, Dir: dir, LocalStore: local})
		if err != nil {
			t.Fatalf("Open(%s): %v", base, err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d
	}
	d := open(t, f, tpl0, dir)
	model := bytes.Clone(f.base)
	same(t, "fresh device", readAll(t, d), model)
	rng := rand.New(rand.NewPCG(3, 4))
	size := int64(len(model))
	for step := 0; step < 400; step++ {
		off := rng.Int64N(size)
		n := min(rng.Int64N(3*cs)+1, size-off)
		if rng.IntN(4) == 0 { // chunk-aligned, to take the whole-chunk paths
			off = off / cs * cs
			n = min((n/cs+1)*cs, size-off)
		}
		switch rng.IntN(4) {
		case 0, 1:
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			if _, err := d.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], p)
		case 2:
			if err := d.Trim(off, n); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
		case 3:
			if err := d.WriteZeroes(off, n, rng.IntN(2) == 0); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
		}
		got := make([]byte, n)
		if _, err := d.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		same(t, "range just changed", got, model[off:off+n])
		// The whole device: a write must not lose the rest of its chunks
		// (later writes would hide that if only the end were checked).
		same(t, "device after a step", readAll(t, d), model)
	}
	same(t, "after random ops", readAll(t, d), model)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	same(t, "re-opened", readAll(t, open(t, f, tpl0, dir)), model)
	// The base is untouched.
	same(t, "base re-opened fresh", readAll(t, open(t, f, tpl0, t.TempDir())), f.base)
}

// A trimmed or zeroed chunk (whole or in part) reads as zeros, never as
// the base, also after a re-open.
func TestTrimNeverReadsBase(t *testing.T) {
	f := newFixture(t, 8)
	dir := t.TempDir()
	d := open(t, f, tpl0, dir)
	if err := d.Trim(cs, 2*cs); err != nil { // chunks 1, 2 whole
		t.Fatal(err)
	}
	if err := d.WriteZeroes(4*cs+100, 200, false); err != nil { // part of chunk 4
		t.Fatal(err)
	}
	want := bytes.Clone(f.base)
	clear(want[cs : 3*cs])
	clear(want[4*cs+100 : 4*cs+300])
	if bytes.Equal(want, f.base) {
		t.Fatal("test image has zeros where it trims")
	}
	same(t, "after trim", readAll(t, d), want)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	same(t, "re-opened after trim", readAll(t, open(t, f, tpl0, dir)), want)
}

// Concurrent readers and writers of the same chunks: a chunk is fetched
// once, and every read sees the base or a whole write.
func TestConcurrentFetchOnce(t *testing.T) {
	f := newFixture(t, 16)
	d := open(t, f, tpl0, t.TempDir())
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, len(f.base))
			if _, err := d.ReadAt(p, 0); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(p, f.base) {
				errs <- errors.New("concurrent read differs from the base")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	nonZero := 0
	for i := 0; i < 16; i++ {
		if !bytes.Equal(f.base[i*cs:(i+1)*cs], make([]byte, cs)) {
			nonZero++
		}
	}
	if got := d.Fetches(); got != uint64(nonZero) {
		t.Fatalf("%d fetches for %d data chunks read by 16 readers: want one each", got, nonZero)
	}
	// Concurrent partial writes to distinct parts of one chunk all land.
	var wg2 sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			p := bytes.Repeat([]byte{byte(g + 1)}, cs/16)
			if _, err := d.WriteAt(p, 5*cs+int64(g)*cs/16); err != nil {
				t.Error(err)
			}
		}()
	}
	wg2.Wait()
	got := make([]byte, cs)
	if _, err := d.ReadAt(got, 5*cs); err != nil {
		t.Fatal(err)
	}
	for g := 0; g < 16; g++ {
		if !bytes.Equal(got[g*cs/16:(g+1)*cs/16], bytes.Repeat([]byte{byte(g + 1)}, cs/16)) {
			t.Fatalf("concurrent write %d lost", g)
		}
	}
}

// Without Sync, a crash (no Close, a fresh Open of the same dir) shows the
// last synced state: synced chunks as written, a chunk clean at the last
// Sync as the base, even though its bytes reached the dirty file.
func TestReopenWithoutSyncShowsLastSync(t *testing.T) {
	f := newFixture(t, 8)
	dir := t.TempDir()
	d := open(t, f, tpl0, dir)
	a := bytes.Repeat([]byte{0xa1}, 100)
	if _, err := d.WriteAt(a, 1*cs+10); err != nil {
		t.Fatal(err)
	}
	if err := d.Trim(2*cs, cs); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteAt(bytes.Repeat([]byte{0xb2}, 100), 4*cs+10); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(f.base)
	copy(want[cs+10:], a)
	clear(want[2*cs : 3*cs])
	same(t, "re-opened after a crash", readAll(t, open(t, f, tpl0, dir)), want)
}

// One flipped byte in a stored chunk: reading it fails (ErrCorrupt), and
// the buffer holds none of the object's bytes; a partial write over it
// fails too instead of copying garbage in.
func TestTamperedChunkIsReadError(t *testing.T) {
	f := newFixture(t, 4)
	tamper(t, chunkObjects(t, f.root)...)
	d := open(t, f, tpl0, t.TempDir())
	p := make([]byte, cs)
	_, err := d.ReadAt(p, cs) // chunk 1 holds data
	if !errors.Is(err, blockstore.ErrCorrupt) {
		t.Fatalf("read of a tampered chunk: %v, want ErrCorrupt", err)
	}
	if !bytes.Equal(p, make([]byte, cs)) {
		t.Fatal("read of a tampered chunk filled the buffer")
	}
	if _, err := d.WriteAt([]byte{1}, cs+5); !errors.Is(err, blockstore.ErrCorrupt) {
		t.Fatalf("partial write over a tampered chunk: %v, want ErrCorrupt", err)
	}
	// A hole needs no object: it still reads (chunk 0 is zeros).
	if _, err := d.ReadAt(p, 0); err != nil {
		t.Fatalf("read of a hole: %v", err)
	}
}

// The dirty set sealed as a generation over the base reads back, in a
// fresh device on it, identical to the device sealed.
func TestSealDirtyAsGeneration(t *testing.T) {
	f := newFixture(t, 24)
	d := open(t, f, tpl0, t.TempDir())
	rng := rand.New(rand.NewPCG(9, 9))
	for k := 0; k < 30; k++ {
		off := rng.Int64N(int64(len(f.base)) - 3*cs)
		p := make([]byte, rng.Int64N(2*cs)+1)
		for i := range p {
			p[i] = byte(rng.Uint32() | 1)
		}
		if _, err := d.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Trim(3*cs, 2*cs); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteZeroes(10*cs+7, 99, false); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, d)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb1 := blockstore.GenRef{Volume: blockstore.Sandbox("sb-1"), Generation: 1}
	w, err := f.repo.NewWriter(ctx, blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: uint64(len(f.base))})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WriteDirty(ctx, w); err != nil {
		t.Fatal(err)
	}
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Entries) != len(d.Dirty()) {
		t.Fatalf("sealed %d entries, device has %d dirty chunks", len(m.Entries), len(d.Dirty()))
	}
	same(t, "fresh device on the sealed generation", readAll(t, open(t, f, sb1, t.TempDir())), want)
}

// A dirty dir of one base is refused for another.
func TestOtherBaseRefused(t *testing.T) {
	f := newFixture(t, 4)
	dir := t.TempDir()
	d := open(t, f, tpl0, dir)
	if _, err := d.WriteAt([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	other := blockstore.GenRef{Volume: blockstore.Template("other"), Generation: 0}
	commit(t, f.repo, blockstore.CommitSpec{Generation: other, DeviceSize: uint64(len(f.base)), ChunkSize: cs}, f.base)
	_, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: other, Dir: dir})
	if !errors.Is(err, cowdev.ErrMismatch) {
		t.Fatalf("Open of another base's dirty dir: %v, want ErrMismatch", err)
	}
}

// With a local store a whole-chunk read is not cached (a second read
// fetches again) and a partial read is; with a remote store both are.
func TestLocalStoreCachesPartialReadsOnly(t *testing.T) {
	f := newFixture(t, 8)
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: tpl0, Dir: t.TempDir(), LocalStore: local, Readahead: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			p := make([]byte, cs)
			for range 2 {
				if _, err := d.ReadAt(p, 1*cs); err != nil {
					t.Fatal(err)
				}
				same(t, "whole chunk 1", p, f.base[cs:2*cs])
			}
			want := uint64(1)
			if local {
				want = 2
			}
			if got := d.Fetches(); got != want || d.Cached(1) == local {
				t.Fatalf("two whole reads of chunk 1: %d fetches, cached %v; want %d, %v", got, d.Cached(1), want, !local)
			}
			for range 2 {
				if _, err := d.ReadAt(p[:100], 2*cs+50); err != nil {
					t.Fatal(err)
				}
				same(t, "part of chunk 2", p[:100], f.base[2*cs+50:2*cs+150])
			}
			if got := d.Fetches(); got != want+1 || !d.Cached(2) {
				t.Fatalf("two partial reads of chunk 2: %d fetches in all, cached %v; want %d, true", got, d.Cached(2), want+1)
			}
		})
	}
}

// A step of Open that fails part way (a cache file that cannot be opened,
// here a directory in its place) leaves no file of the device open, and a
// later Open of the same dir works once the obstacle is gone.
func TestOpenFailingMidwayLeavesNothingOpen(t *testing.T) {
	f := newFixture(t, 40)
	for _, name := range []string{"dirty", "cache.0", "cache.9", "cache.15"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
				t.Fatal(err)
			}
			if _, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: tpl0, Dir: dir}); err == nil {
				t.Fatalf("Open succeeded with a directory at %s", name)
			}
			if left := testutil.OpenFilesUnder(t, dir); len(left) > 0 {
				t.Fatalf("a failed Open left open: %v", left)
			}
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			d := open(t, f, tpl0, dir)
			if left := testutil.OpenFilesUnder(t, dir); len(left) != 17 {
				t.Fatalf("an open device has %d files open, want 17 (dirty and 16 cache files): %v", len(left), left)
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			if left := testutil.OpenFilesUnder(t, dir); len(left) > 0 {
				t.Fatalf("Close left open: %v", left)
			}
		})
	}
}
