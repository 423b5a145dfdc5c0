package cowdev_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cowdev"
)

// isData says chunk i of pattern holds data (every third chunk is zeros:
// no object, nothing to fetch).
func isData(i int64) bool { return i%3 != 0 }

// waitFetches waits until d has made want store fetches.
func waitFetches(t *testing.T, d *cowdev.Device, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.Fetches() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d fetches after 10 s, want %d", d.Fetches(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// dataIn counts the data chunks in [from, to].
func dataIn(from, to int64) uint64 {
	n := uint64(0)
	for i := from; i <= to; i++ {
		if isData(i) {
			n++
		}
	}
	return n
}

// A sequential reader gets the next Readahead chunks fetched ahead of it
// (a local store: into the prefetch ring, not the cache), and not one
// chunk more: the window is the bound.
func TestReadaheadIsBoundedByItsWindow(t *testing.T) {
	const ra = 4
	f := newFixture(t, 40)
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: tpl0, Dir: t.TempDir(), LocalStore: true, Readahead: ra})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := make([]byte, cs)
	for c := int64(0); c < 3; c++ {
		if _, err := d.ReadAt(p, c*cs); err != nil {
			t.Fatal(err)
		}
		same(t, "sequential read", p, f.base[c*cs:(c+1)*cs])
		// Chunks 0..c were read, c+1..c+ra are the window.
		waitFetches(t, d, dataIn(0, c+ra))
		time.Sleep(20 * time.Millisecond) // room for a fetch past the window
		if got, want := d.Fetches(), dataIn(0, c+ra); got != want {
			t.Fatalf("after reading chunk %d: %d fetches, want %d (window of %d)", c, got, want, ra)
		}
		for i := int64(0); i < 40; i++ {
			// A whole chunk read from a local store is not cached,
			// and the read took its prefetched copy.
			if d.Cached(i) {
				t.Fatalf("after reading chunk %d: chunk %d cached", c, i)
			}
			if want := i > c && i <= c+ra && isData(i); d.Prefetched(i) != want {
				t.Fatalf("after reading chunk %d: chunk %d prefetched %v, want %v", c, i, d.Prefetched(i), want)
			}
		}
	}
	// The prefetched chunks read exactly, with no fetch of their own; the
	// read (chunks 3..5) moves the window on to chunk 5+ra.
	buf := make([]byte, 3*cs)
	if _, err := d.ReadAt(buf, 3*cs); err != nil {
		t.Fatal(err)
	}
	same(t, "prefetched chunks", buf, f.base[3*cs:6*cs])
	waitFetches(t, d, dataIn(0, 5+ra))
	// A read at a random offset (chunk 30, a hole) starts no readahead.
	if _, err := d.ReadAt(p[:512], 30*cs+100); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if got, want := d.Fetches(), dataIn(0, 5+ra); got != want {
		t.Fatalf("%d fetches, want %d", got, want)
	}
	if d.Prefetched(31) || d.Prefetched(32) {
		t.Fatal("a read at a random offset prefetched the chunks after it")
	}
	// Reads out of range fail, "sequential" ones too, and queue nothing.
	for _, c := range []int64{-20, -19, 40, 41} {
		if _, err := d.ReadAt(p, c*cs); err == nil {
			t.Fatalf("read of chunk %d of 40 succeeded", c)
		}
	}
}

// A prefetch of a tampered object caches nothing: the read that needs the
// chunk gets ErrCorrupt, never data, and every prefetched chunk was
// authenticated.
func TestReadaheadOfTamperedObjectIsReadError(t *testing.T) {
	f := newFixture(t, 8)
	tamper(t, chunkObjects(t, f.root)...)
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: tpl0, Dir: t.TempDir(), LocalStore: true, Readahead: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := make([]byte, cs)
	if _, err := d.ReadAt(p, 0); err != nil { // chunk 0 is a hole: no object
		t.Fatalf("read of a hole: %v", err)
	}
	waitFetches(t, d, dataIn(1, 4)) // the prefetches were tried (and failed)
	for i := int64(1); i <= 4; i++ {
		if d.Cached(i) || d.Prefetched(i) {
			t.Fatalf("chunk %d: a tampered object was kept by readahead", i)
		}
		clear(p)
		_, err := d.ReadAt(p, i*cs)
		switch {
		case !isData(i) && err != nil:
			t.Fatalf("chunk %d (a hole): %v", i, err)
		case isData(i) && !errors.Is(err, blockstore.ErrCorrupt):
			t.Fatalf("chunk %d: %v, want ErrCorrupt", i, err)
		case !bytes.Equal(p, make([]byte, cs)):
			t.Fatalf("chunk %d: the read filled the buffer with the tampered object's bytes", i)
		}
	}
}

// Close stops the prefetch workers, even with fetches in flight, and
// waits for them: no goroutine of the device outlives it.
func TestCloseStopsReadahead(t *testing.T) {
	// The workers of an earlier test's device may still be returning
	// (see below): they would be counted too.
	for deadline := time.Now().Add(5 * time.Second); workers() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d prefetch workers of earlier devices still running", workers())
		}
		time.Sleep(time.Millisecond)
	}
	st, repo, base, _ := newSlowFixture(t, 40)
	st.set(20*time.Millisecond, nil)
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: repo, Base: tpl0, Dir: t.TempDir(), Readahead: 16})
	if err != nil {
		t.Fatal(err)
	}
	if n := workers(); n == 0 {
		t.Fatal("no prefetch worker running after Open (the check below would prove nothing)")
	}
	p := make([]byte, cs)
	if _, err := d.ReadAt(p, cs); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(p, 2*cs); err != nil { // sequential: a window is queued
		t.Fatal(err)
	}
	same(t, "chunk 2", p, base[2*cs:3*cs])
	waitFetches(t, d, 3) // a prefetch is in flight
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returns after every worker's Done, its last act: a worker
	// may still be returning then (seen runnable at its closing brace).
	for deadline := time.Now().Add(time.Second); workers() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d prefetch workers left 1 s after Close", workers())
		}
		time.Sleep(time.Millisecond)
	}
}

// workers counts the goroutines running a device's prefetch loop.
func workers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "cowdev.(*Device).startReadahead.func1(")
}

// The prefetch ring holds at most two windows: the oldest unread chunk is
// dropped for a new one. A write over a prefetched chunk drops its copy,
// so the chunk reads as written, never as the prefetched base.
func TestPrefetchRingIsBoundedAndDroppedOnWrite(t *testing.T) {
	const ra = 4
	f := newFixture(t, 40)
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: tpl0, Dir: t.TempDir(), LocalStore: true, Readahead: ra})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := make([]byte, cs)
	// Four streams, one after the other (two reads each: the second is
	// sequential): windows 12..15, 22..25, 32..35 and 38..39 hold 2, 3,
	// 3 and 1 data chunks, one more than two windows' room.
	// Each window is in the ring before the next stream starts (a fetch
	// counts when it starts, so the ring is what is waited for).
	want := uint64(0)
	for k, c := range []int64{10, 20, 30, 36} {
		for _, at := range []int64{c, c + 1} {
			if _, err := d.ReadAt(p, at*cs); err != nil {
				t.Fatal(err)
			}
			same(t, "stream read", p, f.base[at*cs:(at+1)*cs])
		}
		want += dataIn(c, min(c+1+ra, 39))
		waitFetches(t, d, want)
		last := min(c+1+ra, 39)
		for !isData(last) {
			last--
		}
		for deadline := time.Now().Add(10 * time.Second); !d.Prefetched(last) || d.PrefetchedCount() < []int{2, 5, 8, 8}[k]; {
			if time.Now().After(deadline) {
				t.Fatalf("stream at chunk %d: %d chunks in the ring after 10 s", c, d.PrefetchedCount())
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := d.PrefetchedCount(); n != 2*ra {
		t.Fatalf("%d chunks in the prefetch ring, want %d", n, 2*ra)
	}
	// The first window's two chunks were fetched in either order.
	if d.Prefetched(13) == d.Prefetched(14) || !d.Prefetched(38) {
		t.Fatalf("prefetched 13, 14, 38: %v %v %v, want one of the oldest (13, 14) dropped", d.Prefetched(13), d.Prefetched(14), d.Prefetched(38))
	}
	w := bytes.Repeat([]byte{0xa5}, cs)
	if _, err := d.WriteAt(w, 25*cs); err != nil {
		t.Fatal(err)
	}
	if d.Prefetched(25) {
		t.Fatal("a written chunk kept its prefetched base")
	}
	if _, err := d.ReadAt(p, 25*cs); err != nil {
		t.Fatal(err)
	}
	same(t, "written chunk", p, w)
	// A partial write of a prefetched chunk copies the prefetched base in.
	if _, err := d.WriteAt(w[:100], 23*cs+10); err != nil {
		t.Fatal(err)
	}
	if d.Prefetched(23) {
		t.Fatal("a partly written chunk kept its prefetched base")
	}
	wantChunk := append([]byte(nil), f.base[23*cs:24*cs]...)
	copy(wantChunk[10:], w[:100])
	if _, err := d.ReadAt(p, 23*cs); err != nil {
		t.Fatal(err)
	}
	same(t, "partly written chunk", p, wantChunk)
	if got := d.Fetches(); got != want {
		t.Fatalf("%d fetches, want %d: a prefetched chunk was fetched again", got, want)
	}
}
