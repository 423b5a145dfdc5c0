package dirstore

import (
	"context"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// TestPackedCommitCrashSafe: a packed generation of two packs is one
// append-written temp file per pack, each fsynced before its link, and
// the manifest after both: a crash after any file system call leaves no
// visible pack without its data on the disk and no manifest without its
// packs durable.
func TestPackedCommitCrashSafe(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recOps{}
	s.ops = rec
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(s, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const cs = blockstore.DefaultChunkSize
	n := blockstore.PackTarget/cs + 8 // two packs
	w, err := repo.NewWriter(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: blockstore.Template("t")}, DeviceSize: uint64(n+8) * cs, Packed: true})
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, cs)
	for i := range n {
		rand.Read(chunk)
		if err := w.WriteChunk(ctx, uint64(i), chunk); err != nil {
			t.Fatal(err)
		}
	}
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Packs) != 2 {
		t.Fatalf("%d packs, want 2", len(m.Packs))
	}
	var packSyncs, packLinks, syncfs int
	for _, op := range rec.log {
		switch {
		case op.kind == "syncfile" && strings.Contains(op.tmp, "/packs/"):
			packSyncs++
		case op.kind == "link" && strings.Contains(op.path, "/packs/"):
			packLinks++
		case op.kind == "syncfs":
			syncfs++
		}
	}
	if packSyncs != 2 || packLinks != 2 || syncfs != 0 {
		t.Fatalf("%d pack fsyncs, %d pack links, %d syncfs; want 2, 2, 0", packSyncs, packLinks, syncfs)
	}
	checkCrashPoints(t, s, rec.log)
}

// A pack a crash left unfinished is a hidden temp file: List does not
// show it, and Sweep removes it.
func TestSweepRemovesUnfinishedPack(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	pw, err := s.NewPack(ctx, "templates/t/packs/00112233445566778899aabbccddeeff")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pw.Write([]byte("half a pack")); err != nil {
		t.Fatal(err)
	}
	// The process dies here: neither Commit nor Abort.
	if keys, err := s.List(ctx, ""); err != nil || len(keys) != 0 {
		t.Fatalf("List = %q, %v; want nothing", keys, err)
	}
	if n, err := s.Sweep(ctx, 0); err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the pack's temp file", n, err)
	}
}
