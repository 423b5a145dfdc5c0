package template

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// baseIDs lists the stored images of layers (bases) in the store.
func baseIDs(t *testing.T, st blockstore.Store) []string {
	t.Helper()
	var out []string
	for _, k := range storeKeys(t, st) {
		v, rest, _ := strings.Cut(strings.TrimPrefix(k, "templates/"), "/")
		if isBase(v) && rest == "meta" {
			out = append(out, v)
		}
	}
	return out
}

// TestRegistrySharedImage: a second template of the same layers (another
// config, another user) is a fork of the image the first stored: no layer
// read, nothing built or uploaded, its user resolved in the stored ids;
// it outlives the first; the image is hidden from ls, cannot be removed
// while a template forks it, and prune removes it once none does. Another
// size is another image.
func TestRegistrySharedImage(t *testing.T) {
	needTools(t)
	ctx := t.Context()
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb, app := busyboxLayer(t), appLayer(t)
	refA, _ := reg.Push("a:1", templatetest.Image(t, appConfig, bb, app))
	cfgB := v1.Config{User: "1234", Env: []string{"B=1"}}
	refB, _ := reg.Push("b:1", templatetest.Image(t, cfgB, bb, app))
	st, repo := templatetest.Repo(t)
	cache := t.TempDir()
	imp := func(name, ref string, size int64) (*blockstore.Manifest, ImageResult, Meta) {
		t.Helper()
		m, res, meta, err := ImportImage(ctx, repo, name, ref, PullOptions{CacheDir: cache}, ImageOptions{Size: size}, t.TempDir())
		if err != nil {
			t.Fatalf("import %s: %v", name, err)
		}
		return m, res, meta
	}
	_, resA, metaA := imp("a", refA, 64<<20)
	if resA.Reused || resA.Base == "" || metaA.Image != resA.Base {
		t.Fatalf("first import: %+v, meta image %q", resA, metaA.Image)
	}
	before := reg.TotalGets()
	var stages []string
	mB, resB, metaB, err := ImportImage(ctx, repo, "b", refB, PullOptions{CacheDir: cache},
		ImageOptions{Size: 64 << 20, Progress: func(p Progress) { stages = append(stages, p.Phase) }}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if n := reg.TotalGets() - before; n != 1 {
		t.Errorf("second import made %d blob GETs, want 1 (its config)", n)
	}
	if !resB.Reused || resB.Base != resA.Base || resB.Entries != resA.Entries || resB.Bytes != resA.Bytes {
		t.Errorf("second import %+v, want the image %s reused with the first's counts %+v", resB, resA.Base, resA)
	}
	if slices.Contains(stages, "unpack") || slices.Contains(stages, "mkfs") || slices.Contains(stages, "upload") {
		t.Errorf("second import went through %v", slices.Compact(stages))
	}
	if mB.Parent == nil || mB.Parent.Volume != blockstore.Template(resA.Base) || len(mB.Entries) != 0 {
		t.Errorf("second template's manifest: parent %v, %d entries; want a fork of %s", mB.Parent, len(mB.Entries), resA.Base)
	}
	if metaB.Config.UID != 1234 || metaB.Config.GID != 1000 || metaB.Config.Env[0] != "B=1" {
		t.Errorf("second template's config %+v: want uid 1234, gid 1000 (app's passwd line), its own env", metaB.Config)
	}
	infos, err := List(ctx, st, repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "a" || infos[1].Name != "b" || infos[1].DataChunks == 0 || infos[1].DataChunks != infos[0].DataChunks {
		t.Errorf("ls = %+v, want a and b (the stored image hidden), each with its data chunks", infos)
	}
	if err := Remove(ctx, st, repo, resA.Base); !errors.Is(err, ErrTemplateInUse) {
		t.Errorf("rm of the stored image while templates fork it = %v", err)
	}
	if err := Remove(ctx, st, repo, "a"); err != nil {
		t.Fatal(err)
	}
	tree := imageTree(t, exportTemplate(t, repo, "b"))
	if n := tree["work"]; n.UID != 1234 || n.GID != 2345 {
		t.Errorf("b's work = %+v after a's removal", n)
	}
	if n := tree["bin/sh"]; n.Target != "busybox" {
		t.Errorf("b's bin/sh = %+v", n)
	}
	// Another size: another image.
	_, resC, _ := imp("c", refA, 32<<20)
	if resC.Reused || resC.Base == resA.Base {
		t.Errorf("import at another size %+v reused %s", resC, resA.Base)
	}
	if got := baseIDs(t, st); len(got) != 2 {
		t.Errorf("stored images %v, want 2", got)
	}
	if res, err := Prune(ctx, st, repo, cache); err != nil || res.Images != 0 {
		t.Fatalf("prune while both images are used = %+v, %v", res, err)
	}
	for _, n := range []string{"b", "c"} {
		if err := Remove(ctx, st, repo, n); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := Prune(ctx, st, repo, cache); err != nil || res.Images != 2 {
		t.Fatalf("prune after every template is gone = %+v, %v; want both images removed", res, err)
	}
	if k := storeKeys(t, st); len(k) != 0 {
		t.Errorf("store after prune: %v", k)
	}
}

// TestRegistrySharedImageConcurrent: two imports of the same new layers
// at once through one layer cache (both held until each has asked for the
// layer) both succeed, and both templates are forks of one stored image.
func TestRegistrySharedImageConcurrent(t *testing.T) {
	needTools(t)
	ctx := t.Context()
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb, app := busyboxLayer(t), appLayer(t)
	ref, _ := reg.Push("x:1", templatetest.Image(t, appConfig, bb, app))
	appd, _ := app.Digest()
	reached, release := reg.Hold(appd)
	defer release()
	st, repo := templatetest.Repo(t)
	var wg sync.WaitGroup
	metas := make([]Meta, 2)
	errs := make([]error, 2)
	cache := t.TempDir() // one cache: both download the layer into it, both build
	for i, name := range []string{"x1", "x2"} {
		wg.Go(func() {
			_, _, metas[i], errs[i] = ImportImage(ctx, repo, name, ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, t.TempDir())
		})
	}
	<-reached
	for deadline := time.Now().Add(time.Minute); reg.Gets(appd) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second import never asked for the layer")
		}
	}
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("import %d: %v", i, err)
		}
	}
	if metas[0].Image == "" || metas[0].Image != metas[1].Image {
		t.Errorf("images %q and %q, want one", metas[0].Image, metas[1].Image)
	}
	if got := baseIDs(t, st); len(got) != 1 {
		t.Errorf("stored images %v, want 1", got)
	}
	for _, name := range []string{"x1", "x2"} {
		tree := imageTree(t, exportTemplate(t, repo, name))
		if n := tree["app/entry.sh"]; n.Mode&0o777 != 0o755 {
			t.Errorf("app/entry.sh of %s = %+v", name, n)
		}
	}
}

// TestRegistryDiffIDMismatch: a config whose diff ID does not match its
// layer's content (the blob's digest is right) is refused as the layer is
// read, in the one pass that unpacks it, and leaves nothing.
func TestRegistryDiffIDMismatch(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	img := templatetest.Image(t, v1.Config{}, busyboxLayer(t), appLayer(t))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[1] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref, _ := reg.Push("lie:1", img)
	st, repo := templatetest.Repo(t)
	cache, work := t.TempDir(), t.TempDir()
	_, _, _, err = ImportImage(t.Context(), repo, "lie", ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, work)
	if !errors.Is(err, ErrBadSource) || !strings.Contains(err.Error(), "config says sha256:abab") {
		t.Fatalf("import = %v, want ErrBadSource naming the config's diff ID", err)
	}
	if k, cb, w := storeKeys(t, st), cacheBlobs(t, cache), onlyFiles(t, work); len(k) != 0 || len(cb) != 0 || len(w) != 0 {
		t.Fatalf("left %v in the store, %v in the cache, %v in the work dir", k, cb, w)
	}
}

// TestRegistrySharedImageWithTree: with a templates directory, a template
// of layers whose image is stored gets its overlay tree unpacked (no
// mkfs, no upload) when no other fork has a tree, else as a hard-linked
// copy of that tree (no pull, no unpack), which outlives the original.
func TestRegistrySharedImageWithTree(t *testing.T) {
	needTools(t)
	if os.Geteuid() != 0 {
		t.Fatal("TestRegistrySharedImageWithTree needs root (the tree keeps the image's owners)")
	}
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb, app := busyboxLayer(t), appLayer(t)
	ref, _ := reg.Push("t:1", templatetest.Image(t, appConfig, bb, app))
	st, repo := templatetest.Repo(t)
	dir := t.TempDir()
	mounts := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mounts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	trees := Trees{Dir: dir, Mountinfo: mounts}
	cache := t.TempDir()
	imp := func(name string, trees Trees) (ImageResult, []string) {
		var stages []string
		_, res, _, err := ImportImage(t.Context(), repo, name, ref, PullOptions{CacheDir: cache},
			ImageOptions{Size: 64 << 20, Trees: trees, Progress: func(p Progress) { stages = append(stages, p.Phase) }}, t.TempDir())
		if err != nil {
			t.Fatalf("import %s: %v", name, err)
		}
		return res, slices.Compact(stages)
	}
	r0, _ := imp("t0", Trees{})
	r1, s1 := imp("t1", trees)
	if !r1.Reused || r1.Base != r0.Base || !slices.Contains(s1, "unpack") || slices.Contains(s1, "mkfs") || slices.Contains(s1, "upload") {
		t.Errorf("t1 %+v through %v; want its tree unpacked, the image of %s reused", r1, s1, r0.Base)
	}
	r2, s2 := imp("t2", trees)
	if !r2.Reused || r2.Base != r0.Base || slices.Contains(s2, "unpack") || slices.Contains(s2, "mkfs") {
		t.Errorf("t2 %+v through %v; want t1's tree cloned, the image reused", r2, s2)
	}
	want := dirTree(t, filepath.Join(dir, "t1"))
	if n := want["work"]; n.UID != 1234 || n.GID != 2345 || n.Mode&0o7777 != 0o755 {
		t.Errorf("t1's tree: work = %+v", n)
	}
	compareTree(t, dirTree(t, filepath.Join(dir, "t2")), want)
	var a, b unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "t1", "bin", "busybox"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dir, "t2", "bin", "busybox"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino {
		t.Errorf("t2's bin/busybox is a copy (inode %d), not a link to t1's (%d)", b.Ino, a.Ino)
	}
	if err := trees.RemoveTemplate(t.Context(), st, repo, "t1"); err != nil {
		t.Fatal(err)
	}
	compareTree(t, dirTree(t, filepath.Join(dir, "t2")), want)
}

func TestKeptSkippedIsBounded(t *testing.T) {
	var many []Skipped
	for range 100000 {
		many = append(many, Skipped{Path: strings.Repeat("d", 200), Reason: "device node or fifo"})
	}
	kept := keptSkipped(many)
	n := 0
	for _, s := range kept {
		n += len(s.Path) + len(s.Reason)
	}
	if len(kept) == 0 || n > maxBaseSkipped || len(kept) == len(many) {
		t.Fatalf("kept %d of %d skipped entries, %d bytes", len(kept), len(many), n)
	}
	if few := many[:3]; len(keptSkipped(few)) != 3 {
		t.Fatal("a few skipped entries not all kept")
	}
}
