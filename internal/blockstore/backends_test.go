package blockstore_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
)

// onBackends runs fn once over a fresh directory store and once over a
// fresh bucket of a real S3 server (versitygw), each with its own repo:
// heads, snapshots, forks and GC are store-agnostic only if both pass.
// wrap wraps the store (nil: as is) before the repo is made.
func onBackends(t *testing.T, wrap func(blockstore.Store) blockstore.Store, fn func(t *testing.T, st blockstore.Store, r *blockstore.Repo)) {
	t.Helper()
	var srv *s3test.Server
	for _, name := range []string{"dir", "s3"} {
		t.Run(name, func(t *testing.T) {
			var st blockstore.Store
			if name == "dir" {
				ds, err := dirstore.Open(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				st = ds
			} else {
				if srv == nil {
					srv = s3test.Start(t)
				}
				st = srv.NewStore(t, "")
			}
			if wrap != nil {
				st = wrap(st)
			}
			nk, _, err := blockstore.GenerateNodeKey("node-a")
			if err != nil {
				t.Fatal(err)
			}
			r, err := blockstore.New(st, nk, blockstore.Options{Compression: blockstore.CompressS2})
			if err != nil {
				t.Fatal(err)
			}
			fn(t, st, r)
		})
	}
}

// commitRandom commits ref over parent (nil: none) with n random chunks
// at indexes 0..n-1 of an 8-chunk device, and returns them.
func commitRandom(t *testing.T, r *blockstore.Repo, ref blockstore.GenRef, parent *blockstore.GenRef, n int) map[uint64][]byte {
	t.Helper()
	chunks := map[uint64][]byte{}
	for i := range uint64(n) {
		chunks[i] = randChunk(t)
	}
	if _, err := r.Commit(context.Background(), blockstore.CommitSpec{Generation: ref, Parent: parent, DeviceSize: 8 * cs, ChunkSize: cs}, chunks); err != nil {
		t.Fatalf("Commit(%s): %v", ref, err)
	}
	return chunks
}

// tamper replaces the object key by a copy with one bit flipped.
func tamper(t *testing.T, st blockstore.Store, key string) {
	t.Helper()
	ctx := context.Background()
	b, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := st.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, key, b); err != nil {
		t.Fatal(err)
	}
}

// copyObject puts a copy of object from under the name to.
func copyObject(t *testing.T, st blockstore.Store, from, to string) {
	t.Helper()
	ctx := context.Background()
	b, err := st.Get(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, to, bytes.Clone(b)); err != nil {
		t.Fatal(err)
	}
}
