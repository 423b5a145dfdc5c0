package blockstore_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// Snapshots name committed generations: listed by name, a taken name is
// ErrExists, a bad name ErrInvalidKey, a missing generation ErrNotFound,
// delete is idempotent, and a tampered or renamed snapshot object is
// ErrCorrupt.
func TestSnapshots(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-1")
		g0 := blockstore.GenRef{Volume: v, Generation: 0}
		commitRandom(t, r, g0, nil, 1)
		commitRandom(t, r, blockstore.GenRef{Volume: v, Generation: 1}, &g0, 1)
		if s, err := r.Snapshots(ctx, v); err != nil || len(s) != 0 {
			t.Fatalf("Snapshots of a volume without = %v, %v", s, err)
		}
		for name, g := range map[string]uint64{"before-upgrade": 0, "b.2_x-Y": 1, "a": 1} {
			if err := r.PutSnapshot(ctx, v, name, g); err != nil {
				t.Fatalf("PutSnapshot(%q): %v", name, err)
			}
		}
		if err := r.PutSnapshot(ctx, v, "a", 0); !errors.Is(err, blockstore.ErrExists) {
			t.Errorf("PutSnapshot of a taken name = %v, want ErrExists", err)
		}
		if err := r.PutSnapshot(ctx, v, "later", 5); !errors.Is(err, blockstore.ErrNotFound) {
			t.Errorf("PutSnapshot of a missing generation = %v, want ErrNotFound", err)
		}
		for _, name := range []string{"", ".hidden", "a/b", "..", "a b", string(make([]byte, 129))} {
			if err := r.PutSnapshot(ctx, v, name, 0); !errors.Is(err, blockstore.ErrInvalidKey) {
				t.Errorf("PutSnapshot(%q) = %v, want ErrInvalidKey", name, err)
			}
		}
		want := []blockstore.Snapshot{{Name: "a", Generation: 1}, {Name: "b.2_x-Y", Generation: 1}, {Name: "before-upgrade", Generation: 0}}
		if s, err := r.Snapshots(ctx, v); err != nil || !reflect.DeepEqual(s, want) {
			t.Fatalf("Snapshots = %+v, %v; want %+v", s, err, want)
		}
		for range 2 {
			if err := r.DeleteSnapshot(ctx, v, "a"); err != nil {
				t.Fatalf("DeleteSnapshot: %v", err)
			}
		}
		if s, err := r.Snapshots(ctx, v); err != nil || !reflect.DeepEqual(s, want[1:]) {
			t.Fatalf("after delete Snapshots = %+v, %v; want %+v", s, err, want[1:])
		}
		copyObject(t, st, "sandboxes/sb-1/snap/before-upgrade", "sandboxes/sb-1/snap/renamed")
		if _, err := r.Snapshots(ctx, v); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Snapshots with a renamed object = %v, want ErrCorrupt", err)
		}
		if err := r.DeleteSnapshot(ctx, v, "renamed"); err != nil {
			t.Fatal(err)
		}
		tamper(t, st, "sandboxes/sb-1/snap/b.2_x-Y")
		if _, err := r.Snapshots(ctx, v); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Snapshots with a tampered object = %v, want ErrCorrupt", err)
		}
	})
}
