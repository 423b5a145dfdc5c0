package blockstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// Publish is a compare-and-swap: the first head has Seq 1, each next one
// must name the current head, carry an epoch no older than its, and name a
// committed generation; every refusal is ErrFenced and changes nothing.
func TestPublishCompareAndSwap(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-1")
		if h, err := r.Head(ctx, v); err != nil || h != (blockstore.Head{}) {
			t.Fatalf("Head of a new volume = %+v, %v; want the zero Head", h, err)
		}
		// Nothing committed yet: no generation to name.
		if _, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{Generation: 0, WriterEpoch: 1}); !errors.Is(err, blockstore.ErrFenced) {
			t.Fatalf("Publish of an uncommitted generation = %v, want ErrFenced", err)
		}
		commitRandom(t, r, blockstore.GenRef{Volume: v, Generation: 0}, nil, 2)
		h1, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{Generation: 0, WriterEpoch: 3, Node: "node-a"})
		if err != nil {
			t.Fatal(err)
		}
		if want := (blockstore.Head{Seq: 1, Generation: 0, WriterEpoch: 3, Node: "node-a"}); h1 != want {
			t.Fatalf("Publish = %+v, want %+v", h1, want)
		}
		p := blockstore.GenRef{Volume: v, Generation: 0}
		commitRandom(t, r, blockstore.GenRef{Volume: v, Generation: 1}, &p, 1)
		for _, c := range []struct {
			name         string
			expect, next blockstore.Head
		}{
			{"expects no head", blockstore.Head{}, blockstore.Head{Generation: 1, WriterEpoch: 3}},
			{"expects a later head", blockstore.Head{Seq: 2}, blockstore.Head{Generation: 1, WriterEpoch: 3}},
			{"older writer epoch", h1, blockstore.Head{Generation: 1, WriterEpoch: 2}},
			{"uncommitted generation", h1, blockstore.Head{Generation: 7, WriterEpoch: 3}},
		} {
			if _, err := r.Publish(ctx, v, c.expect, c.next); !errors.Is(err, blockstore.ErrFenced) {
				t.Errorf("%s: Publish = %v, want ErrFenced", c.name, err)
			}
			if h, err := r.Head(ctx, v); err != nil || h != h1 {
				t.Fatalf("%s: after a refused Publish the head is %+v, %v; want %+v", c.name, h, err, h1)
			}
		}
		// The same epoch and a newer one both pass.
		h2, err := r.Publish(ctx, v, h1, blockstore.Head{Generation: 1, WriterEpoch: 3, Node: "node-a"})
		if err != nil || h2.Seq != 2 {
			t.Fatalf("Publish over head 1 = %+v, %v", h2, err)
		}
		h3, err := r.Publish(ctx, v, h2, blockstore.Head{Generation: 0, WriterEpoch: 4, Node: "node-b"})
		if err != nil || h3.Seq != 3 {
			t.Fatalf("Publish over head 2 = %+v, %v", h3, err)
		}
		if h, err := r.Head(ctx, v); err != nil || h != h3 {
			t.Fatalf("Head = %+v, %v; want %+v", h, err, h3)
		}
		if _, err := r.Publish(ctx, v, h3, blockstore.Head{Generation: 1, Node: string(make([]byte, 300))}); err == nil {
			t.Fatal("Publish with a 300-byte node name succeeded")
		}
	})
}

// Of concurrent publishers that all expect the same head exactly one
// wins; the others get ErrFenced and the head is the winner's.
func TestPublishRaceOneWins(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-race")
		commitRandom(t, r, blockstore.GenRef{Volume: v, Generation: 0}, nil, 1)
		for round := range 3 {
			expect, err := r.Head(ctx, v)
			if err != nil {
				t.Fatal(err)
			}
			const n = 8
			var wg sync.WaitGroup
			heads := make([]blockstore.Head, n)
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					heads[i], errs[i] = r.Publish(ctx, v, expect, blockstore.Head{WriterEpoch: uint64(round), Node: fmt.Sprintf("node-%d", i)})
				}()
			}
			wg.Wait()
			won := -1
			for i, err := range errs {
				switch {
				case err == nil && won >= 0:
					t.Fatalf("round %d: publishers %d and %d both won", round, won, i)
				case err == nil:
					won = i
				case !errors.Is(err, blockstore.ErrFenced):
					t.Fatalf("round %d: publisher %d: %v, want ErrFenced", round, i, err)
				}
			}
			if won < 0 {
				t.Fatalf("round %d: no publisher won", round)
			}
			if h, err := r.Head(ctx, v); err != nil || h != heads[won] || h.Seq != expect.Seq+1 {
				t.Fatalf("round %d: head %+v, %v; winner published %+v", round, h, err, heads[won])
			}
		}
	})
}

// A head object that was tampered with, or copied to another head's name,
// is ErrCorrupt, never a head.
func TestTamperedHeadIsCorrupt(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-1")
		commitRandom(t, r, blockstore.GenRef{Volume: v, Generation: 0}, nil, 1)
		if _, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{}); err != nil {
			t.Fatal(err)
		}
		copyObject(t, st, "sandboxes/sb-1/head/00000000000000000001", "sandboxes/sb-1/head/00000000000000000002")
		if _, err := r.Head(ctx, v); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Head with a copied head object = %v, want ErrCorrupt", err)
		}
		if err := st.Delete(ctx, "sandboxes/sb-1/head/00000000000000000002"); err != nil {
			t.Fatal(err)
		}
		tamper(t, st, "sandboxes/sb-1/head/00000000000000000001")
		if _, err := r.Head(ctx, v); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Head with a tampered head object = %v, want ErrCorrupt", err)
		}
		if err := st.Put(ctx, "sandboxes/sb-1/head/x", []byte("stray")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Head(ctx, v); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Head with a stray head object = %v, want ErrCorrupt", err)
		}
	})
}

// hookStore runs before(key) ahead of each Put.
type hookStore struct {
	blockstore.Store
	before func(key string)
}

func (s *hookStore) Put(ctx context.Context, key string, data []byte) error {
	if s.before != nil {
		s.before(key)
	}
	return s.Store.Put(ctx, key, data)
}

// A publisher that read head 1, then slept while heads 2 and 3 were
// published and GC freed the superseded head 2, creates head 2 again:
// its Put succeeds, but it is below the head, so Publish says ErrFenced
// and the head stays 3.
func TestPublishIntoFreedSeqIsFenced(t *testing.T) {
	var hs *hookStore
	onBackends(t, func(st blockstore.Store) blockstore.Store {
		hs = &hookStore{Store: st}
		return hs
	}, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-1")
		commitRandom(t, r, blockstore.GenRef{Volume: v, Generation: 0}, nil, 1)
		h1, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{WriterEpoch: 1})
		if err != nil {
			t.Fatal(err)
		}
		var h3 blockstore.Head
		hs.before = func(key string) {
			if key != "sandboxes/sb-1/head/00000000000000000002" {
				return
			}
			hs.before = nil
			h2, err := r.Publish(ctx, v, h1, blockstore.Head{WriterEpoch: 2})
			if err != nil {
				t.Error(err)
				return
			}
			if h3, err = r.Publish(ctx, v, h2, blockstore.Head{WriterEpoch: 2}); err != nil {
				t.Error(err)
			}
			if err := st.Delete(ctx, key); err != nil { // what GC does
				t.Error(err)
			}
		}
		if _, err := r.Publish(ctx, v, h1, blockstore.Head{WriterEpoch: 1}); !errors.Is(err, blockstore.ErrFenced) {
			t.Fatalf("Publish into a freed head number = %v, want ErrFenced", err)
		}
		if h, err := r.Head(ctx, v); err != nil || h != h3 || h.Seq != 3 {
			t.Fatalf("Head = %+v, %v; want %+v", h, err, h3)
		}
	})
}
