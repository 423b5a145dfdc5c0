package cowdev_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/basecache"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
)

// sharedCache opens the base cache under root as another process would:
// its own Cache, and (through the device) its own files and mapping.
func sharedCache(t *testing.T, root string) *basecache.Cache {
	t.Helper()
	c, err := basecache.Open(root, basecache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func openShared(t *testing.T, f *fixture, base blockstore.GenRef, g *basecache.Cache, local bool, readahead int) *cowdev.Device {
	t.Helper()
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: base, Dir: t.TempDir(), Shared: g, LocalStore: local, Readahead: readahead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// dataChunks counts the chunks of img that are not all zeros (those a
// read fetches).
func dataChunks(img []byte) uint64 {
	n := uint64(0)
	for off := 0; off < len(img); off += cs {
		for _, b := range img[off : off+cs] {
			if b != 0 {
				n++
				break
			}
		}
	}
	return n
}

// A chunk one device fetched is read from the node's cache by the next
// device over the same template generation: the second device reads
// everything right with no store fetch at all, by whole chunks, parts of
// chunks and sequential readahead, with a local store and a remote one.
func TestSharedCacheServesTheNextDevice(t *testing.T) {
	const chunks = 45
	for _, local := range []bool{true, false} {
		for _, ra := range []int{-1, 4} {
			t.Run(fmt.Sprintf("local=%v/readahead=%d", local, ra), func(t *testing.T) {
				f := newFixture(t, chunks)
				root := t.TempDir()
				a := openShared(t, f, tpl0, sharedCache(t, root), local, ra)
				// Partial reads of a few chunks, then the whole device in
				// sequential 2-chunk reads.
				p := make([]byte, 100)
				for _, i := range []int64{1, 2, 4} {
					if _, err := a.ReadAt(p, i*cs+10); err != nil {
						t.Fatal(err)
					}
					same(t, "part", p, f.base[i*cs+10:i*cs+110])
				}
				got := make([]byte, len(f.base))
				for off := 0; off < len(got); off += 2 * cs {
					if _, err := a.ReadAt(got[off:min(off+2*cs, len(got))], int64(off)); err != nil {
						t.Fatal(err)
					}
				}
				same(t, "device a", got, f.base)
				if n, want := a.Fetches(), dataChunks(f.base); n < want {
					t.Fatalf("device a fetched %d chunks, the image has %d data chunks", n, want)
				}
				b := openShared(t, f, tpl0, sharedCache(t, root), local, ra)
				for _, i := range []int64{1, 7} {
					if _, err := b.ReadAt(p, i*cs+500); err != nil {
						t.Fatal(err)
					}
					same(t, "part on b", p, f.base[i*cs+500:i*cs+600])
				}
				same(t, "device b", readAll(t, b), f.base)
				if n := b.Fetches(); n != 0 {
					t.Fatalf("device b fetched %d chunks; want all from the shared cache", n)
				}
			})
		}
	}
}

// Writes stay the device's own: the shared cache keeps the base, which a
// third device reads.
func TestSharedCacheKeepsTheBase(t *testing.T) {
	const chunks = 15
	f := newFixture(t, chunks)
	root := t.TempDir()
	a := openShared(t, f, tpl0, sharedCache(t, root), true, -1)
	readAll(t, a)
	want := append([]byte(nil), f.base...)
	w := []byte(strings.Repeat("w", 300))
	for _, off := range []int64{cs + 5, 7*cs - 100} {
		if _, err := a.WriteAt(w, off); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], w)
	}
	if err := a.Trim(2*cs, cs); err != nil {
		t.Fatal(err)
	}
	clear(want[2*cs : 3*cs])
	same(t, "device a after writes", readAll(t, a), want)
	c := openShared(t, f, tpl0, sharedCache(t, root), true, -1)
	same(t, "device c", readAll(t, c), f.base)
}

// A tampered object is a read error and never enters the shared cache: the
// next device fails the same read too.
func TestSharedCacheNeverHoldsATamperedChunk(t *testing.T) {
	const chunks = 15
	f := newFixture(t, chunks)
	tamper(t, chunkObjects(t, f.root)...)
	root := t.TempDir()
	g, err := sharedCache(t, root).Generation(tpl0, cs, chunks)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, dev := range []string{"a", "b"} {
		d := openShared(t, f, tpl0, sharedCache(t, root), true, -1)
		if _, err := d.ReadAt(make([]byte, cs), cs); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("device %s: read of a tampered chunk: %v, want ErrCorrupt", dev, err)
		}
	}
	for i := range int64(chunks) {
		if g.Has(i) {
			t.Fatalf("chunk %d is in the shared cache though every object is tampered", i)
		}
	}
}

// The shared cache is used only for a template's generation (a
// sandbox's own is read by its one device), and a seal stops its use (the
// new base holds chunks the cache has the old base's bytes of).
func TestSharedCacheOnlyForTemplates(t *testing.T) {
	const chunks = 15
	f := newFixture(t, chunks)
	root := t.TempDir()
	d := openShared(t, f, tpl0, sharedCache(t, root), true, -1)
	readAll(t, d)
	want := append([]byte(nil), f.base...)
	w := []byte(strings.Repeat("s", cs))
	if _, err := d.WriteAt(w, 4*cs); err != nil {
		t.Fatal(err)
	}
	copy(want[4*cs:], w)
	if err := d.Trim(5*cs, cs); err != nil {
		t.Fatal(err)
	}
	clear(want[5*cs : 6*cs])
	seal(t, d, sbGen(1))
	same(t, "after the seal", readAll(t, d), want)

	// Two devices over the sandbox's generation fetch each for itself.
	for _, dev := range []string{"a", "b"} {
		d := openShared(t, f, sbGen(1), sharedCache(t, root), true, -1)
		same(t, "device "+dev+" over the sandbox's generation", readAll(t, d), want)
		if d.Fetches() == 0 {
			t.Fatalf("device %s over a sandbox generation read from the shared cache", dev)
		}
	}
	// A cache that cannot be opened (a file where its directory goes) is
	// not used, and the device works without it.
	c := sharedCache(t, t.TempDir())
	if err := os.WriteFile(filepath.Join(c.Dir(), "template"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	same(t, "a device whose cache failed", readAll(t, openShared(t, f, tpl0, c, true, -1)), f.base)
}

// A device over a base the node has cached offers its clean cached chunks
// as file segments (nbdsrv sends them with sendfile); a hole, a written
// chunk, or any chunk after a seal is read with ReadAt. Served over NBD,
// nbdcopy reads the mix back byte-identical.
func TestSharedCacheSentFromFiles(t *testing.T) {
	nbdtest.NeedPeers(t, "nbdcopy")
	const chunks = 30
	f := newFixture(t, chunks)
	root := t.TempDir()
	readAll(t, openShared(t, f, tpl0, sharedCache(t, root), true, -1))
	d := openShared(t, f, tpl0, sharedCache(t, root), true, -1)
	if segs, ok := d.ReadFiles(nil, cs+100, 2*cs-200); !ok || len(segs) != 2 || segs[0].Len != cs-100 || segs[1].Len != cs-100 {
		t.Fatalf("ReadFiles of cached chunks 1-2: %+v, %v", segs, ok)
	}
	if _, ok := d.ReadFiles(nil, 0, cs); ok {
		t.Fatal("ReadFiles of a hole (chunk 0): ok")
	}
	want := append([]byte(nil), f.base...)
	w := []byte(strings.Repeat("w", 500))
	if _, err := d.WriteAt(w, 2*cs+9); err != nil {
		t.Fatal(err)
	}
	copy(want[2*cs+9:], w)
	if _, ok := d.ReadFiles(nil, cs, 2*cs); ok {
		t.Fatal("ReadFiles over a written chunk: ok")
	}
	out := filepath.Join(t.TempDir(), "copy")
	nbdtest.Peer(t, "nbdcopy", serve(t, d), out)
	sameFile(t, out, want)
	if n := d.Fetches(); n != 0 {
		t.Fatalf("%d store fetches; want every base chunk from the node's cache", n)
	}
	seal(t, d, sbGen(1))
	if _, ok := d.ReadFiles(nil, cs, cs); ok {
		t.Fatal("ReadFiles after a seal: ok")
	}
}
