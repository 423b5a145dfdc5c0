package blockstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// A deleted volume is tombstoned and has lost its heads and snapshots;
// afterwards it takes no head (ErrFenced, ErrDeleted) and no snapshot
// (ErrDeleted), and a second DeleteVolume, or one of a volume that never
// existed, succeeds.
func TestDeleteVolume(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-1")
		g0 := blockstore.GenRef{Volume: v, Generation: 0}
		commitRandom(t, r, g0, nil, 1)
		h1, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{WriterEpoch: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Publish(ctx, v, h1, blockstore.Head{WriterEpoch: 1}); err != nil {
			t.Fatal(err)
		}
		if err := r.PutSnapshot(ctx, v, "s", 0); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := r.DeleteVolume(ctx, v); err != nil {
				t.Fatalf("DeleteVolume: %v", err)
			}
		}
		if h, err := r.Head(ctx, v); err != nil || h.Seq != 0 {
			t.Fatalf("Head after DeleteVolume = %+v, %v", h, err)
		}
		if s, err := r.Snapshots(ctx, v); err != nil || len(s) != 0 {
			t.Fatalf("Snapshots after DeleteVolume = %+v, %v", s, err)
		}
		if _, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{WriterEpoch: 9}); !errors.Is(err, blockstore.ErrFenced) || !errors.Is(err, blockstore.ErrDeleted) {
			t.Fatalf("Publish after DeleteVolume = %v, want ErrFenced and ErrDeleted", err)
		}
		if err := r.PutSnapshot(ctx, v, "t", 0); !errors.Is(err, blockstore.ErrDeleted) {
			t.Fatalf("PutSnapshot after DeleteVolume = %v, want ErrDeleted", err)
		}
		if err := r.DeleteVolume(ctx, blockstore.Sandbox("never")); err != nil {
			t.Fatalf("DeleteVolume of a volume that never was: %v", err)
		}
		// A tampered tombstone is an error, not a verdict either way.
		tamper(t, st, "sandboxes/sb-1/deleted")
		if _, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{WriterEpoch: 9}); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Publish with a tampered tombstone = %v, want ErrCorrupt", err)
		}
	})
}
