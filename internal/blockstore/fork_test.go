package blockstore_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// Fork is O(1): dst@0 is one manifest (plus dst's own key) whose parent is
// the source; it reads as the source, byte for byte, and a later
// generation of dst diverges from it without changing the source. A
// second fork into dst, a fork into the source's own volume and a fork of
// a missing generation are refused; Fork publishes no head.
func TestForkReadsSourceAndDiverges(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		src := blockstore.GenRef{Volume: blockstore.Template("busybox"), Generation: 0}
		commitRandom(t, r, src, nil, 6)
		srcBytes := readAll(t, r, src)
		dst := blockstore.Sandbox("sb-fork")
		m, err := r.Fork(ctx, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if m.Parent == nil || *m.Parent != src || len(m.Entries) != 0 || m.Generation != 0 || m.DeviceSize != 8*cs {
			t.Fatalf("fork manifest = %+v", m)
		}
		keys, err := st.List(ctx, dst.String()+"/")
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"sandboxes/sb-fork/gen/00000000000000000000", "sandboxes/sb-fork/key"}; len(keys) != 2 || keys[0] != want[0] || keys[1] != want[1] {
			t.Fatalf("fork wrote %q, want %q", keys, want)
		}
		d0 := blockstore.GenRef{Volume: dst, Generation: 0}
		if !bytes.Equal(readAll(t, r, d0), srcBytes) {
			t.Fatal("the fork does not read as its source")
		}
		if h, err := r.Head(ctx, dst); err != nil || h.Seq != 0 {
			t.Fatalf("Fork published a head: %+v, %v", h, err)
		}
		newChunk := randChunk(t)
		if _, err := r.Commit(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: dst, Generation: 1}, Parent: &d0, DeviceSize: 8 * cs}, map[uint64][]byte{2: newChunk}); err != nil {
			t.Fatal(err)
		}
		d1 := readAll(t, r, blockstore.GenRef{Volume: dst, Generation: 1})
		want := bytes.Clone(srcBytes)
		copy(want[2*cs:], newChunk)
		if !bytes.Equal(d1, want) {
			t.Fatal("dst@1 is not the source with chunk 2 replaced")
		}
		if !bytes.Equal(readAll(t, r, src), srcBytes) {
			t.Fatal("writing the fork changed the source")
		}
		// A fork of a fork: the chain crosses two volumes.
		if _, err := r.Fork(ctx, blockstore.GenRef{Volume: dst, Generation: 1}, blockstore.Sandbox("sb-grandchild")); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(readAll(t, r, blockstore.GenRef{Volume: blockstore.Sandbox("sb-grandchild")}), want) {
			t.Fatal("a fork of the fork does not read as dst@1")
		}
		for _, c := range []struct {
			name string
			src  blockstore.GenRef
			dst  blockstore.Volume
			want error
		}{
			{"dst has generations", src, dst, blockstore.ErrExists},
			{"into its own volume", src, src.Volume, blockstore.ErrExists},
			{"missing source", blockstore.GenRef{Volume: src.Volume, Generation: 9}, blockstore.Sandbox("sb-other"), blockstore.ErrNotFound},
			{"bad dst", src, blockstore.Sandbox("../x"), blockstore.ErrInvalidKey},
		} {
			if _, err := r.Fork(ctx, c.src, c.dst); !errors.Is(err, c.want) {
				t.Errorf("%s: Fork = %v, want %v", c.name, err, c.want)
			}
		}
		if gens, err := r.Generations(ctx, blockstore.Sandbox("sb-other")); err != nil || len(gens) != 0 {
			t.Fatalf("a refused fork left generations %v, %v", gens, err)
		}
		// The fork publishes like any generation.
		if _, err := r.Publish(ctx, dst, blockstore.Head{}, blockstore.Head{Generation: 0, WriterEpoch: 1}); err != nil {
			t.Fatal(err)
		}
	})
}

// A fork's dst must be new: one that has a head (without generations) or
// is deleted and not yet freed is refused with ErrExists.
func TestForkRefusesUsedVolume(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		src := blockstore.GenRef{Volume: blockstore.Template("busybox"), Generation: 0}
		commitRandom(t, r, src, nil, 1)
		if err := st.Put(ctx, "sandboxes/sb-h/head/00000000000000000001", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Fork(ctx, src, blockstore.Sandbox("sb-h")); !errors.Is(err, blockstore.ErrExists) {
			t.Errorf("Fork into a volume with a head = %v, want ErrExists", err)
		}
		d := blockstore.Sandbox("sb-d")
		if _, err := r.Fork(ctx, src, d); err != nil {
			t.Fatal(err)
		}
		if err := r.DeleteVolume(ctx, d); err != nil {
			t.Fatal(err)
		}
		if err := st.Delete(ctx, "sandboxes/sb-d/gen/00000000000000000000"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Fork(ctx, src, d); !errors.Is(err, blockstore.ErrExists) {
			t.Errorf("Fork into a deleted volume = %v, want ErrExists", err)
		}
	})
}
