package template

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// TestVolumeLifecycle: create stores an empty ext4 of the size asked as
// generation 0 under head 1; a second create of the ID is refused; ls
// shows it with its head; a create cut short before its publish is not
// listed; rm deletes it (ls empty, a second rm is not found) and GC then
// frees every object of it.
func TestVolumeLifecycle(t *testing.T) {
	needTools(t)
	ctx := t.Context()
	store, repo := templatetest.Repo(t)
	if _, err := CreateVolume(ctx, repo, "data", 1000, t.TempDir()); err == nil {
		t.Fatal("create of a size that is not a multiple of the chunk size succeeded")
	}
	h, err := CreateVolume(ctx, repo, "data", 8<<20, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if h.Seq != 1 || h.Generation != 0 || h.Node != CreateVolumeNode {
		t.Errorf("head %+v, want seq 1 over generation 0 by %s", h, CreateVolumeNode)
	}
	if _, err := CreateVolume(ctx, repo, "data", 8<<20, t.TempDir()); !errors.Is(err, ErrVolumeExists) {
		t.Errorf("second create: %v, want %v", err, ErrVolumeExists)
	}
	im, err := repo.Open(ctx, blockstore.GenRef{Volume: blockstore.Vol("data")})
	if err != nil {
		t.Fatal(err)
	}
	// ext4's superblock magic 0xEF53 at byte 1024+56.
	buf := make([]byte, im.ChunkSize())
	if err := im.ReadChunk(ctx, 0, buf); err != nil {
		t.Fatal(err)
	}
	if buf[1024+56] != 0x53 || buf[1024+57] != 0xef {
		t.Errorf("generation 0 holds no ext4 superblock")
	}
	// An unfinished create: generation 0 without a head.
	if _, err := importImage(ctx, repo, blockstore.Vol("half"), writeZeros(t, 1<<20), nil, nil); err != nil {
		t.Fatal(err)
	}
	vs, err := ListVolumes(ctx, store, repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 1 || vs[0].ID != "data" || vs[0].DeviceSize != 8<<20 || vs[0].Head.Seq != 1 {
		t.Fatalf("ls %+v, want only data (8 MiB, head 1)", vs)
	}
	if err := RemoveVolume(ctx, repo, "data"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveVolume(ctx, repo, "data"); !errors.Is(err, ErrVolumeNotFound) {
		t.Errorf("second rm: %v, want %v", err, ErrVolumeNotFound)
	}
	if vs, err := ListVolumes(ctx, store, repo); err != nil || len(vs) != 0 {
		t.Errorf("ls after rm: %+v, %v; want none", vs, err)
	}
	// Grace 1ns: everything is old enough; GC frees both volumes whole.
	if _, err := repo.GC(ctx, blockstore.GCOptions{Grace: 1}); err != nil {
		t.Fatal(err)
	}
	left, err := store.List(ctx, string(blockstore.KindVolume)+"/")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("after rm and gc the store still holds %v", left)
	}
}

// writeZeros is a file of n zero bytes (an image with no data chunks).
func writeZeros(t *testing.T, n int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "zeros.img")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, n); err != nil {
		t.Fatal(err)
	}
	return p
}
