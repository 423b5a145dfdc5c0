package template

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template/templatetest"
	"github.com/ctld/ctld/internal/templatelock"
)

// dirTree reads a directory's tree as imageTree reads an image's.
func dirTree(t *testing.T, root string) map[string]node {
	t.Helper()
	out := map[string]node{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		n := node{Mode: st.Mode, UID: int(st.Uid), GID: int(st.Gid)}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFLNK:
			n.Target, err = os.Readlink(p)
		case syscall.S_IFREG:
			var b []byte
			b, err = os.ReadFile(p)
			n.Content = string(b)
		}
		out[rel] = n
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// treeFixture is a tar of sampleTree (and the tree it must give), a block
// store with its repository, and an empty templates directory whose
// mountinfo file shows no mounts.
func treeFixture(t *testing.T) (src string, want map[string]node, store blockstore.Store, repo *blockstore.Repo, trees Trees) {
	t.Helper()
	es, want := sampleTree()
	src = filepath.Join(t.TempDir(), "tree.tar")
	if err := os.WriteFile(src, mkTar(t, es), 0o644); err != nil {
		t.Fatal(err)
	}
	store, repo = templatetest.Repo(t)
	mounts := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mounts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return src, want, store, repo, Trees{Dir: t.TempDir(), Mountinfo: mounts}
}

// TestImportKeepsTree: an import given a templates directory keeps the
// tree it built the block image from as the template's overlay lower,
// with the source's owners, modes, links and xattrs (a root builder); a
// second import of the name is refused before it builds; rm is refused
// while an overlay has the tree as a lower, then removes both; a failed
// import leaves no tree and no hidden stage.
func TestImportKeepsTree(t *testing.T) {
	needTools(t)
	if os.Geteuid() != 0 {
		t.Fatal("TestImportKeepsTree needs root (the tree keeps the source's owners)")
	}
	src, want, store, repo, trees := treeFixture(t)
	dir, mounts := trees.Dir, trees.Mountinfo
	if _, _, err := ImportSource(t.Context(), repo, "sample", Source{Path: src}, ImageOptions{Size: 32 << 20, Trees: trees}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	compareTree(t, dirTree(t, filepath.Join(dir, "sample")), want)
	if v, err := unix.Lgetxattr(filepath.Join(dir, "sample", "xattr-file"), "trusted.ctld", make([]byte, 16)); err != nil || v != 2 {
		t.Errorf("trusted.ctld xattr of the tree's file: %d bytes, %v", v, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("templates dir holds %v, want only sample", ents)
	}

	// The same name again: refused, the tree untouched.
	_, other := templatetest.Repo(t) // the tree is checked, not only the block store
	if _, _, err := ImportSource(t.Context(), other, "sample", Source{Path: src}, ImageOptions{Size: 32 << 20, Trees: trees}, t.TempDir()); !errors.Is(err, ErrTemplateExists) {
		t.Errorf("second import of sample with a tree: %v, want %v", err, ErrTemplateExists)
	}

	// An overlay with the tree as a lower: rm refused, both kept.
	line := "120 30 0:50 / /run/ctld/rootfs/x/merged rw,relatime - overlay overlay rw,lowerdir=" + filepath.Join(dir, "sample") + ",upperdir=/s/u,workdir=/s/w\n"
	if err := os.WriteFile(mounts, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trees.RemoveTemplate(t.Context(), store, repo, "sample"); !errors.Is(err, ErrTemplateInUse) {
		t.Fatalf("rm while an overlay uses the tree: %v, want %v", err, ErrTemplateInUse)
	}
	if ok, _ := trees.Has("sample"); !ok {
		t.Fatal("the refused rm took the tree")
	}
	if gens, err := repo.Generations(t.Context(), blockstore.Template("sample")); err != nil || len(gens) != 1 {
		t.Fatalf("the refused rm took the block template: %v %v", gens, err)
	}
	if err := os.WriteFile(mounts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trees.RemoveTemplate(t.Context(), store, repo, "sample"); err != nil {
		t.Fatal(err)
	}
	if ents := treeEntries(dir); len(ents) != 0 {
		t.Errorf("templates dir after rm holds %v", ents)
	}
	if err := trees.RemoveTemplate(t.Context(), store, repo, "sample"); !errors.Is(err, ErrTemplateNotFound) {
		t.Errorf("rm again: %v, want %v", err, ErrTemplateNotFound)
	}

	// A source refused while unpacking: no tree, no stage left.
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, mkTar(t, []tent{{h: regH("../escape", 0o644, 0, 0), content: "x"}}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ImportSource(t.Context(), repo, "bad", Source{Path: bad}, ImageOptions{Size: 32 << 20, Trees: trees}, t.TempDir()); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("import of a tar with ..: %v", err)
	}
	if ents := treeEntries(dir); len(ents) != 0 {
		t.Errorf("templates dir after a failed import holds %s", strings.Join(ents, " "))
	}
}

// treeEntries lists a templates directory but its lock file (made by the
// first rm, never removed).
func treeEntries(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.Name() != templatelock.Name {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestImportTreeOnly: an overlay-only import keeps the tree (owners,
// modes, links as the source says) and stores nothing in the block store;
// without a templates directory it is refused; the name is then taken in
// both root modes; rm removes the tree; a refused source leaves nothing.
func TestImportTreeOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestImportTreeOnly needs root (the tree keeps the source's owners)")
	}
	src, want, store, repo, trees := treeFixture(t)
	dir := trees.Dir
	ctx := t.Context()
	if _, _, err := ImportSource(ctx, repo, "sample", Source{Path: src}, ImageOptions{Size: 32 << 20, TreeOnly: true}, t.TempDir()); !errors.Is(err, ErrNoTrees) {
		t.Fatalf("tree-only import without a templates dir: %v, want %v", err, ErrNoTrees)
	}
	m, res, err := ImportSource(ctx, repo, "sample", Source{Path: src}, ImageOptions{Size: 32 << 20, Trees: trees, TreeOnly: true}, t.TempDir())
	if err != nil || m != nil || res.Entries == 0 {
		t.Fatalf("tree-only import = %v, %+v, %v", m, res, err)
	}
	compareTree(t, dirTree(t, filepath.Join(dir, "sample")), want)
	if keys, err := store.List(ctx, ""); err != nil || len(keys) != 0 {
		t.Fatalf("block store after a tree-only import: %v, %v", keys, err)
	}
	if ents := treeEntries(dir); len(ents) != 1 {
		t.Errorf("templates dir holds %v, want only sample", ents)
	}
	// The name is taken for a block import with the tree too.
	if _, _, err := ImportSource(ctx, repo, "sample", Source{Path: src}, ImageOptions{Size: 32 << 20, Trees: trees}, t.TempDir()); !errors.Is(err, ErrTemplateExists) {
		t.Errorf("import over a tree-only sample: %v, want %v", err, ErrTemplateExists)
	}
	if err := trees.RemoveTemplate(ctx, store, repo, "sample"); err != nil {
		t.Fatal(err)
	}
	if ents := treeEntries(dir); len(ents) != 0 {
		t.Errorf("templates dir after rm holds %v", ents)
	}
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, mkTar(t, []tent{{h: regH("../escape", 0o644, 0, 0), content: "x"}}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ImportSource(ctx, repo, "bad", Source{Path: bad}, ImageOptions{Size: 32 << 20, Trees: trees, TreeOnly: true}, t.TempDir()); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("tree-only import of a tar with ..: %v", err)
	}
	if ents := treeEntries(dir); len(ents) != 0 {
		t.Errorf("templates dir after a failed import holds %s", strings.Join(ents, " "))
	}
}
