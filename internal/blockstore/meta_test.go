package blockstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// A volume's metadata round-trips, is created once, and a copy of another
// volume's metadata (a bucket rewriting a template's image config) is
// ErrCorrupt, never its payload.
func TestMeta(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		a, b := blockstore.Template("a"), blockstore.Template("b")
		if _, err := r.Meta(ctx, a); !errors.Is(err, blockstore.ErrNotFound) {
			t.Fatalf("Meta before any = %v, want ErrNotFound", err)
		}
		if err := r.PutMeta(ctx, a, []byte(`{"user":"app"}`)); err != nil {
			t.Fatal(err)
		}
		if err := r.PutMeta(ctx, b, []byte(`{"user":"root"}`)); err != nil {
			t.Fatal(err)
		}
		if got, err := r.Meta(ctx, a); err != nil || string(got) != `{"user":"app"}` {
			t.Fatalf("Meta = %q, %v", got, err)
		}
		if err := r.PutMeta(ctx, a, []byte(`{}`)); !errors.Is(err, blockstore.ErrExists) {
			t.Fatalf("second PutMeta = %v, want ErrExists", err)
		}
		if err := r.PutMeta(ctx, a, make([]byte, blockstore.MaxMetaBytes+1)); err == nil {
			t.Fatal("oversized metadata accepted")
		}
		// b's object moved under a's name.
		blob, err := st.Get(ctx, "templates/b/meta")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.DeleteMeta(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := r.DeleteMeta(ctx, a); err != nil {
			t.Fatalf("second DeleteMeta = %v", err)
		}
		if err := st.Put(ctx, "templates/a/meta", blob); err != nil {
			t.Fatal(err)
		}
		if got, err := r.Meta(ctx, a); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("Meta of a moved object = %q, %v, want ErrCorrupt", got, err)
		}
	})
}
