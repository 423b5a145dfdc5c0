package template

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// TestPruneLayerCache: prune removes the layers no template references (a
// removed template's) and what an interrupted download left, and keeps
// the others; an import in flight that found its layers in the cache
// holds prune off until its template records them, so they survive; a
// registry template from before layers were recorded makes prune refuse.
func TestPruneLayerCache(t *testing.T) {
	needTools(t)
	ctx := t.Context()
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb, app := busyboxLayer(t), appLayer(t)
	extra := templatetest.GzLayer(t, mkTar(t, []tent{{h: regH("extra", 0o644, 0, 0), content: "extra"}}))
	refA, _ := reg.Push("a:1", templatetest.Image(t, appConfig, bb, app))
	refB, _ := reg.Push("b:1", templatetest.Image(t, v1.Config{}, bb))
	refC, _ := reg.Push("c:1", templatetest.Image(t, appConfig, bb, app, extra))
	st, repo := templatetest.Repo(t)
	cache := t.TempDir()
	imp := func(name, ref string) error {
		_, _, _, err := ImportImage(ctx, repo, name, ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, t.TempDir())
		return err
	}
	hex := func(l v1.Layer) string { return strings.TrimPrefix(layerDigest(t, l), "sha256:") }
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	for _, c := range [][2]string{{"a", refA}, {"b", refB}} {
		if err := imp(c[0], c[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cache, "blobs", "sha256", ".partial-1"), []byte("half a layer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Remove(ctx, st, repo, "a"); err != nil {
		t.Fatal(err)
	}
	res, err := Prune(ctx, st, repo, cache)
	if err != nil || res.Removed != 2 || res.Kept != 1 || res.Bytes == 0 {
		t.Fatalf("prune = %+v, %v; want app's layer and the partial removed, busybox's kept", res, err)
	}
	if got := cacheBlobs(t, cache); !slices.Equal(got, []string{hex(bb)}) {
		t.Fatalf("cache after prune: %v, want %v", got, []string{hex(bb)})
	}

	// app's layer again, unreferenced once a2 is gone; then c, whose
	// first two layers are cached, waits on its third while prune runs.
	if err := imp("a2", refA); err != nil {
		t.Fatal(err)
	}
	if err := Remove(ctx, st, repo, "a2"); err != nil {
		t.Fatal(err)
	}
	reached, release := reg.Hold(v1.Hash{Algorithm: "sha256", Hex: hex(extra)})
	defer release()
	imported := make(chan error, 1)
	go func() { imported <- imp("c", refC) }()
	select {
	case <-reached:
	case err := <-imported:
		t.Fatalf("import of c ended before its held layer: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("import of c never asked for its third layer")
	}
	pruned := make(chan error, 1)
	go func() {
		var err error
		res, err = Prune(ctx, st, repo, cache)
		pruned <- err
	}()
	select {
	case err := <-pruned:
		t.Fatalf("prune ran during an import (%+v, %v)", res, err)
	case <-time.After(500 * time.Millisecond):
	}
	release()
	if err := <-imported; err != nil {
		t.Fatalf("import of c beside a prune: %v", err)
	}
	if err := <-pruned; err != nil || res.Removed != 0 || res.Kept != 3 {
		t.Fatalf("prune after the import = %+v, %v; want all three layers kept", res, err)
	}
	if got, want := cacheBlobs(t, cache), sorted(hex(bb), hex(app), hex(extra)); !slices.Equal(got, want) {
		t.Fatalf("cache = %v, want %v", got, want)
	}

	// A template whose metadata has no layers: prune refuses, removes nothing.
	m, _, err := ReadMeta(ctx, repo, "b")
	if err != nil {
		t.Fatal(err)
	}
	m.Layers = nil
	b, _ := json.Marshal(m)
	if err := repo.DeleteMeta(ctx, blockstore.Template("b")); err != nil {
		t.Fatal(err)
	}
	if err := repo.PutMeta(ctx, blockstore.Template("b"), b); err != nil {
		t.Fatal(err)
	}
	if err := Remove(ctx, st, repo, "c"); err != nil {
		t.Fatal(err)
	}
	if res, err := Prune(ctx, st, repo, cache); err == nil || !strings.Contains(err.Error(), "template b was imported before its layers were recorded") || res.Removed != 0 {
		t.Fatalf("prune with a legacy template = %+v, %v", res, err)
	}
	if got := cacheBlobs(t, cache); len(got) != 3 {
		t.Fatalf("a refused prune removed layers: %v", got)
	}
}
