package template

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// TestImportTemplate: a built image goes in as generation 0 and reads back
// byte for byte; zeros are not stored; import, list and remove behave as
// their errors say.
func TestImportTemplate(t *testing.T) {
	needTools(t)
	es, _ := sampleTree()
	src := filepath.Join(t.TempDir(), "tree.tar")
	if err := os.WriteFile(src, mkTar(t, es), 0o644); err != nil {
		t.Fatal(err)
	}
	store, repo := templatetest.Repo(t)
	var last Progress
	m, _, err := ImportSource(t.Context(), repo, "sample", Source{Path: src},
		ImageOptions{Size: 32 << 20, Progress: func(p Progress) { last = p }}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if last.Phase != "stored" || last.Bytes != 32<<20 {
		t.Errorf("last progress %+v, want stored at %d bytes", last, 32<<20)
	}
	// The same tree built again is the reference (mkfs output is not
	// reproducible: UUIDs, times), so compare the store with the image
	// it was made from: import that image under another name too.
	img, _ := build(t, Source{Path: src}, 32<<20)
	m2, err := Import(t.Context(), repo, "sample2", img, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	im, err := repo.Open(t.Context(), m2.Ref())
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(want))
	buf := make([]byte, im.ChunkSize())
	for i := range im.Chunks() {
		if err := im.ReadChunk(t.Context(), i, buf); err != nil {
			t.Fatal(err)
		}
		got = append(got, buf...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("generation 0 does not read back as the image")
	}
	total := int(m.DeviceSize / uint64(m.ChunkSize))
	if len(m.Entries) == 0 || len(m.Entries) > total/4 {
		t.Errorf("%d of %d chunks stored; want only the few holding data", len(m.Entries), total)
	}
	if _, err := Import(t.Context(), repo, "sample2", img, nil); !errors.Is(err, ErrTemplateExists) {
		t.Errorf("second import: %v, want ErrTemplateExists", err)
	}
	if _, _, err := ImportSource(t.Context(), repo, "sample", Source{Path: src}, ImageOptions{Size: 32 << 20}, t.TempDir()); !errors.Is(err, ErrTemplateExists) {
		t.Errorf("second ImportSource: %v, want ErrTemplateExists", err)
	}
	if _, err := Import(t.Context(), repo, "Bad/Name", img, nil); err == nil {
		t.Error("import under a bad name succeeded")
	}

	infos, err := List(t.Context(), store, repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "sample" || infos[1].Name != "sample2" || infos[0].DeviceSize != 32<<20 {
		t.Fatalf("List = %+v", infos)
	}

	// A sandbox over the template keeps it.
	parent := m.Ref()
	sb := blockstore.GenRef{Volume: blockstore.Sandbox("sb1")}
	if _, err := repo.Commit(t.Context(), blockstore.CommitSpec{Generation: sb, Parent: &parent, DeviceSize: m.DeviceSize},
		map[uint64][]byte{3: bytes.Repeat([]byte{7}, int(m.ChunkSize))}); err != nil {
		t.Fatal(err)
	}
	if err := Remove(t.Context(), store, repo, "sample"); !errors.Is(err, ErrTemplateInUse) {
		t.Fatalf("remove of a used template: %v, want ErrTemplateInUse", err)
	}
	keys, _ := store.List(t.Context(), "sandboxes/")
	for _, k := range keys {
		if err := store.Delete(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	if err := Remove(t.Context(), store, repo, "sample"); err != nil {
		t.Fatal(err)
	}
	if left, _ := store.List(t.Context(), "templates/sample/"); len(left) != 0 {
		t.Errorf("left after remove: %v", left)
	}
	if err := Remove(t.Context(), store, repo, "sample"); !errors.Is(err, ErrTemplateNotFound) {
		t.Errorf("second remove: %v, want ErrTemplateNotFound", err)
	}
	infos, err = List(t.Context(), store, repo)
	if err != nil || len(infos) != 1 || infos[0].Name != "sample2" {
		t.Errorf("List after remove = %+v, %v", infos, err)
	}
	// An image not a whole number of chunks is refused.
	odd := filepath.Join(t.TempDir(), "odd.img")
	os.WriteFile(odd, []byte(strings.Repeat("x", 5000)), 0o644)
	if _, err := Import(t.Context(), repo, "odd", odd, nil); err == nil {
		t.Error("import of a 5000-byte image succeeded")
	}
}

// TestImportCheckedRefusesUnclean: an import's e2fsck runs while its
// chunks upload (importChecked); an image it does not find clean is not
// committed: no template.
func TestImportCheckedRefusesUnclean(t *testing.T) {
	needTools(t)
	_, repo := templatetest.Repo(t)
	junk := writeZeros(t, 1<<20)
	f, err := os.OpenFile(junk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("not a file system"), 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := importChecked(t.Context(), repo, "junk", junk, nil); err == nil || !strings.Contains(err.Error(), "e2fsck -fn") {
		t.Fatalf("import of an image that is no file system = %v", err)
	}
	if gens, err := repo.Generations(t.Context(), blockstore.Template("junk")); err != nil || len(gens) != 0 {
		t.Fatalf("generations after a refused import: %v, %v", gens, err)
	}
}
