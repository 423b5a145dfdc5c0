package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/template/templatetest"
	"github.com/ctld/ctld/internal/templatelock"
)

// TestRemoveWaitsForClaimMount: `template rm` while ctld's claim is
// stalled mid-mount over the tree (it holds the templates lock shared)
// waits; once the claim's overlay is in the mount table and the lock is
// let go, rm sees it and refuses, the tree untouched. Without the lock rm
// would remove the tree under the mount being made.
func TestRemoveWaitsForClaimMount(t *testing.T) {
	store, repo := templatetest.Repo(t)
	dir := t.TempDir()
	tree := filepath.Join(dir, "sample")
	if err := os.MkdirAll(filepath.Join(tree, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	mounts := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mounts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	trees := Trees{Dir: dir, Mountinfo: mounts}
	// The claim: checked the tree, now mounting.
	unlock, err := templatelock.Shared(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- trees.RemoveTemplate(t.Context(), store, repo, "sample") }()
	select {
	case err := <-done:
		unlock()
		t.Fatalf("rm returned %v while a claim was mounting the tree; want it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	if ok, _ := trees.Has("sample"); !ok {
		t.Fatal("the tree went while the claim was mounting it")
	}
	// The mount is made, then the claim lets go.
	line := "120 30 0:50 / /run/ctld/rootfs/x/merged rw,relatime - overlay overlay rw,lowerdir=" + tree + ",upperdir=/s/u,workdir=/s/w\n"
	if err := os.WriteFile(mounts, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	unlock()
	if err := <-done; !errors.Is(err, ErrTemplateInUse) {
		t.Fatalf("rm after the claim's mount: %v, want %v", err, ErrTemplateInUse)
	}
	if ok, _ := trees.Has("sample"); !ok {
		t.Fatal("the refused rm took the tree")
	}
	// Unmounted: rm goes through; the lock file stays (never unlinked).
	if err := os.WriteFile(mounts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trees.RemoveTemplate(t.Context(), store, repo, "sample"); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != templatelock.Name {
		t.Fatalf("templates dir after rm holds %v, want only the lock file", ents)
	}
}
