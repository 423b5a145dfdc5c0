package basecache

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/testutil"
)

var ref = blockstore.GenRef{Volume: blockstore.Template("busybox"), Generation: 3}

func openCache(t *testing.T, root, boot string, opts Options) *Cache {
	t.Helper()
	opts.bootID = boot
	c, err := Open(root, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func openGen(t *testing.T, c *Cache, cs, chunks int64) *Gen {
	t.Helper()
	return openGenOf(t, c, ref, cs, chunks)
}

func openGenOf(t *testing.T, c *Cache, r blockstore.GenRef, cs, chunks int64) *Gen {
	t.Helper()
	g, err := c.Generation(r, cs, chunks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

func chunkOf(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

// A chunk one opener puts is read by another opener of the same
// generation (its own files and mapping, as in another process); what
// nobody put is not there.
func TestPutIsSeenByAnotherOpener(t *testing.T) {
	root := t.TempDir()
	a := openGen(t, openCache(t, root, "boot-1", Options{}), 4096, 100)
	b := openGen(t, openCache(t, root, "boot-1", Options{}), 4096, 100)
	a.Put(37, chunkOf(0xab, 4096))
	if !b.Has(37) || b.Has(36) || b.Has(38) {
		t.Fatalf("after a put of chunk 37: b has 36 %v 37 %v 38 %v; want only 37", b.Has(36), b.Has(37), b.Has(38))
	}
	p := make([]byte, 100)
	if err := b.ReadAt(p, 37, 4000-4); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p[:96], chunkOf(0xab, 96)) {
		t.Fatalf("read back %x", p[:8])
	}
	if err := b.ReadAt(make([]byte, 10), 37, 4090); err == nil {
		t.Fatal("a read past the chunk's end: no error")
	}
	// Puts of wrong sizes or out of range are ignored.
	a.Put(1, chunkOf(1, 100))
	a.Put(100, chunkOf(1, 4096))
	a.Put(-1, chunkOf(1, 4096))
	if b.Has(1) || b.Has(100) || b.Has(-1) {
		t.Fatal("a put of a short chunk or one out of range was cached")
	}
}

// Concurrent puts of chunks sharing one map word all land (the bits are
// set atomically).
func TestConcurrentPutsKeepEveryBit(t *testing.T) {
	root := t.TempDir()
	gs := []*Gen{
		openGen(t, openCache(t, root, "b", Options{}), 512, 64),
		openGen(t, openCache(t, root, "b", Options{}), 512, 64),
	}
	var wg sync.WaitGroup
	for i := range int64(64) {
		wg.Go(func() { gs[i%2].Put(i, chunkOf(byte(i), 512)) })
	}
	wg.Wait()
	p := make([]byte, 512)
	for i := range int64(64) {
		if !gs[0].Has(i) {
			t.Fatalf("chunk %d lost its bit", i)
		}
		if err := gs[1].ReadAt(p, i, 0); err != nil || !bytes.Equal(p, chunkOf(byte(i), 512)) {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
}

// An opener with another geometry for the same generation has a cache of
// its own (it never reads the first's layout); files of a wrong size are
// refused and left as they are.
func TestOtherGeometryIsAnotherCache(t *testing.T) {
	root := t.TempDir()
	c := openCache(t, root, "b", Options{})
	g := openGen(t, c, 4096, 10)
	g.Put(2, chunkOf(7, 4096))
	for _, geo := range [][2]int64{{4096, 11}, {8192, 10}} {
		if openGen(t, c, geo[0], geo[1]).Has(2) {
			t.Fatalf("geometry %v sees the chunk of 4096x10", geo)
		}
	}
	if !openGen(t, c, 4096, 10).Has(2) {
		t.Fatal("the other geometries changed the cache")
	}
	if err := os.Truncate(filepath.Join(c.Dir(), string(blockstore.KindTemplate), "busybox", "3-4096x10", "map"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Generation(ref, 4096, 10); err == nil || !strings.Contains(err.Error(), "another geometry") {
		t.Fatalf("a map of the wrong size: %v", err)
	}
	if _, err := c.Generation(ref, 0, 10); err == nil {
		t.Fatal("chunk size 0: no error")
	}
	if _, err := c.Generation(blockstore.GenRef{Volume: blockstore.Template("../x")}, 4096, 1); err == nil {
		t.Fatal("a bad volume id: no error")
	}
}

// A new boot removes what earlier boots left (their maps may name data a
// crash lost) and starts empty; the same boot keeps its cache.
func TestNewBootStartsEmpty(t *testing.T) {
	root := t.TempDir()
	openGen(t, openCache(t, root, "boot-1", Options{}), 4096, 4).Put(1, chunkOf(1, 4096))
	if !openGen(t, openCache(t, root, "boot-1", Options{}), 4096, 4).Has(1) {
		t.Fatal("the same boot lost its chunk")
	}
	c := openCache(t, root, "boot-2", Options{})
	if openGen(t, c, 4096, 4).Has(1) {
		t.Fatal("a new boot trusts an earlier boot's chunk")
	}
	ents, err := os.ReadDir(root)
	if err != nil || len(ents) != 1 || ents[0].Name() != "boot-2" {
		t.Fatalf("root holds %v (%v), want only boot-2", ents, err)
	}
	if c.Dir() != filepath.Join(root, "boot-2") {
		t.Fatalf("Dir %s", c.Dir())
	}
	if _, err := Open("relative", Options{}); err == nil {
		t.Fatal("a relative root: no error")
	}
	if _, err := Open(root, Options{MinFree: 2}); err == nil {
		t.Fatal("min free 200%: no error")
	}
}

// Below the free-space floor nothing is cached (reads then go to the
// store); the real boot id is used when none is given.
func TestNothingCachedBelowMinFree(t *testing.T) {
	c, err := Open(t.TempDir(), Options{MinFree: 1})
	if err != nil {
		t.Fatal(err)
	}
	g := openGen(t, c, 4096, 4)
	g.Put(0, chunkOf(1, 4096))
	if g.Has(0) {
		t.Fatal("cached with no room left")
	}
	if boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id"); filepath.Base(c.Dir()) != strings.TrimSpace(string(boot)) {
		t.Fatalf("cache dir %s is not named by the boot id %s", c.Dir(), boot)
	}
}

// Prune removes the caches of generations that are gone, keeps the
// others and, when keep cannot tell, keeps them too; names it does not
// know are left alone.
func TestPrune(t *testing.T) {
	root := t.TempDir()
	c := openCache(t, root, "b", Options{})
	gone := blockstore.GenRef{Volume: blockstore.Template("old"), Generation: 0}
	unsure := blockstore.GenRef{Volume: blockstore.Template("flaky"), Generation: 2}
	for _, r := range []blockstore.GenRef{ref, gone, unsure} {
		g, err := c.Generation(r, 4096, 4)
		if err != nil {
			t.Fatal(err)
		}
		g.Put(1, chunkOf(1, 4096))
		_ = g.Close()
	}
	stray := filepath.Join(c.Dir(), "notakind", "x")
	if err := os.MkdirAll(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	asked := map[string]bool{}
	n, err := c.Prune(context.Background(), func(_ context.Context, r blockstore.GenRef) (bool, error) {
		asked[r.String()] = true
		switch r {
		case gone:
			return false, nil
		case unsure:
			return false, errors.New("store unreachable")
		}
		return true, nil
	})
	if n != 1 || err == nil || !strings.Contains(err.Error(), "store unreachable") {
		t.Fatalf("Prune = %d, %v; want 1 removed and the keep error", n, err)
	}
	if len(asked) != 3 {
		t.Fatalf("keep asked for %v, want the three generations", asked)
	}
	if _, err := os.Stat(filepath.Join(c.Dir(), string(blockstore.KindTemplate), "old")); !os.IsNotExist(err) {
		t.Fatalf("the gone template's cache dir: %v, want removed", err)
	}
	for _, r := range []blockstore.GenRef{ref, unsure} {
		if !openGenOf(t, c, r, 4096, 4).Has(1) {
			t.Fatalf("%s lost its cache", r)
		}
	}
	if _, err := os.Stat(stray); err != nil {
		t.Fatalf("a stray dir was touched: %v", err)
	}
}

// A Generation that fails part way (a data file that cannot be opened, or
// a map of the wrong size) leaves none of its files open.
func TestGenerationFailingMidwayLeavesNothingOpen(t *testing.T) {
	for _, bad := range []string{"data.0", "data.7", "map"} {
		t.Run(bad, func(t *testing.T) {
			c := openCache(t, t.TempDir(), "b", Options{})
			dir := filepath.Join(c.Dir(), string(blockstore.KindTemplate), "busybox", "3-4096x10")
			if err := os.MkdirAll(filepath.Join(dir, bad), 0o700); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Generation(ref, 4096, 10); err == nil {
				t.Fatalf("Generation succeeded with a directory at %s", bad)
			}
			if left := testutil.OpenFilesUnder(t, dir); len(left) > 0 {
				t.Fatalf("a failed Generation left open: %v", left)
			}
		})
	}
}
