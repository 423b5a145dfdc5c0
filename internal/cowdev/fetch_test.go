package cowdev_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/cowdev"
)

// slowStore is a store with a chunk fetch latency (a remote store's) and
// failures on demand.
type slowStore struct {
	blockstore.Store
	mu    sync.Mutex
	delay time.Duration
	fail  error // every chunk Get fails with it while set
}

func (s *slowStore) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	delay, fail := s.delay, s.fail
	s.mu.Unlock()
	if strings.Contains(key, "/chunks/") {
		time.Sleep(delay)
		if fail != nil {
			return nil, fail
		}
	}
	return s.Store.Get(ctx, key)
}

func (s *slowStore) set(delay time.Duration, fail error) {
	s.mu.Lock()
	s.delay, s.fail = delay, fail
	s.mu.Unlock()
}

func newSlowFixture(t *testing.T, chunks int) (*slowStore, *blockstore.Repo, []byte, string) {
	t.Helper()
	root := t.TempDir()
	ds, err := dirstore.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	st := &slowStore{Store: ds}
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := pattern(int64(chunks)*cs, 11)
	commit(t, repo, blockstore.CommitSpec{Generation: tpl0, DeviceSize: uint64(len(base)), ChunkSize: cs}, base)
	return st, repo, base, root
}

// A read spanning several uncached chunks fetches them concurrently: it
// takes about one fetch's latency, not the sum, and returns the base.
func TestReadFetchesChunksConcurrently(t *testing.T) {
	const lat = 100 * time.Millisecond
	st, repo, base, _ := newSlowFixture(t, 15)
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: repo, Base: tpl0, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st.set(lat, nil)
	buf := make([]byte, len(base))
	start := time.Now()
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	same(t, "concurrent fetch", buf, base)
	n := d.Fetches() // chunks with data: 10 of 15 (every third is a hole)
	if n != 10 {
		t.Fatalf("%d fetches, want 10", n)
	}
	// One after another they take n*lat (1 s); concurrently (8 at a
	// time) about 2*lat.
	if took >= time.Duration(n)*lat/2 {
		t.Fatalf("reading %d uncached chunks took %v: fetched one after another (latency %v each)", n, took, lat)
	}
	// Cached now: no more fetches.
	st.set(0, errors.New("store must not be asked again"))
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	same(t, "cached", buf, base)
}

// A failed concurrent fetch fails the read (no data from it) and leaves
// nothing behind: once the store answers again the same read is exact,
// and a tampered chunk among several is ErrCorrupt, never data.
func TestConcurrentFetchErrorsDoNotPoison(t *testing.T) {
	st, repo, base, root := newSlowFixture(t, 15)
	d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: repo, Base: tpl0, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st.set(time.Millisecond, errors.New("store unreachable"))
	buf := make([]byte, len(base))
	if _, err := d.ReadAt(buf, 0); err == nil {
		t.Fatal("read succeeded while every chunk fetch failed")
	}
	st.set(0, nil)
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatalf("read after the store recovered: %v", err)
	}
	same(t, "after recovery", buf, base)

	// A fresh device over the same base; flip a byte in every chunk object
	// but one, so the read's concurrent fetches hit tampered objects.
	objs := chunkObjects(t, root)
	if len(objs) < 2 {
		t.Fatalf("%d chunk objects", len(objs))
	}
	tamper(t, objs[1:]...)
	d2, err := cowdev.Open(context.Background(), cowdev.Config{Repo: repo, Base: tpl0, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := d2.ReadAt(buf, 0); !errors.Is(err, blockstore.ErrCorrupt) {
		t.Fatalf("read over tampered chunks: %v, want ErrCorrupt", err)
	}
	// Every data chunk reads exactly or fails; none reads as other data.
	good := 0
	for i := 0; i < 15; i++ {
		c := make([]byte, cs)
		_, err := d2.ReadAt(c, int64(i)*cs)
		switch {
		case err == nil:
			same(t, "chunk", c, base[i*cs:(i+1)*cs])
			good++
		case !errors.Is(err, blockstore.ErrCorrupt):
			t.Fatalf("chunk %d: %v, want ErrCorrupt", i, err)
		}
	}
	if good != 15-(len(objs)-1) {
		t.Fatalf("%d chunks read, want %d", good, 15-(len(objs)-1))
	}
}

// Compressed chunks (S2 and zstd) fetched concurrently into adjacent
// parts of one read's buffer come back exact (a decoder writing past its
// chunk would clobber a neighbour's bytes or fail its checksum).
func TestConcurrentFetchCompressedChunksExact(t *testing.T) {
	for _, c := range []blockstore.Compression{blockstore.CompressS2, blockstore.CompressZstd} {
		t.Run(string(c), func(t *testing.T) { testConcurrentFetchCompressed(t, c) })
	}
}

func testConcurrentFetchCompressed(t *testing.T, c blockstore.Compression) {
	ds, err := dirstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(ds, nk, blockstore.Options{Compression: c})
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	base := make([]byte, n*cs)
	for j := range base {
		base[j] = "the quick brown fox "[(j*(j/cs+3))%20] ^ byte(j>>9)
	}
	commit(t, repo, blockstore.CommitSpec{Generation: tpl0, DeviceSize: uint64(len(base)), ChunkSize: cs}, base)
	for round := 0; round < 5; round++ {
		d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: repo, Base: tpl0, Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(base))
		if _, err := d.ReadAt(buf, 0); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		same(t, "compressed chunks", buf, base)
		_ = d.Close()
	}
}
