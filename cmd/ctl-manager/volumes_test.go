package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
)

// TestCLIPauseResume: sandbox pause prints the head and the verdict,
// resume runs the next generation from the last claim's spec, snapshot ls
// shows the head, and the calls the fake node has no store for fail with
// the one-line error.
func TestCLIPauseResume(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1", "--mode", "block", "--", "sleep", "infinity")
	out := e.ok("sandbox", "pause", "sb1")
	if !strings.Contains(out, "sandbox sb1 generation 1 paused") || !strings.Contains(out, "head 1: block generation 1") || !strings.Contains(out, "verified: sb1 generation 1 is gone") {
		t.Fatalf("pause output:\n%s", out)
	}
	if out := e.ok("sandbox", "resume", "sb1"); !strings.Contains(out, "sandbox sb1 ready: generation 2") {
		t.Fatalf("resume output:\n%s", out)
	}
	if out := e.ok("snapshot", "ls", "sb1"); !strings.Contains(out, "sandbox sb1: head 1 = block generation 1") {
		t.Fatalf("snapshot ls output:\n%s", out)
	}
	r := e.run("", "sandbox", "snapshot", "sb1", "s1")
	if r.code != exitFailed || !errLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "no block store") {
		t.Fatalf("snapshot on the fake node: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := e.run("", "sandbox", "fork", "sb1"); r.code != 2 || !strings.Contains(r.stderr, "SOURCE and NEW") {
		t.Fatalf("fork with one argument: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestCLIStoreForgetGC: store forget deletes a sandbox volume's roots
// (refused while the node runs a generation of it), and store gc then
// frees its chunks and manifests; --dry-run lists and deletes nothing.
func TestCLIStoreForgetGC(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "node.key")
	nk, err := blockstore.LoadOrCreateNodeKeyFile(keyFile, "node")
	if err != nil {
		t.Fatal(err)
	}
	st, err := dirstore.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vol := blockstore.Sandbox("old")
	chunk := bytes.Repeat([]byte("x"), blockstore.DefaultChunkSize)
	if _, err := repo.Commit(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: vol, Generation: 1}, DeviceSize: 1 << 20}, map[uint64][]byte{0: chunk}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish(ctx, vol, blockstore.Head{}, blockstore.Head{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--store", filepath.Join(dir, "store"), "--node-key", keyFile}
	store := func(args ...string) result { return e.run("", append(append([]string{"store"}, args...), flags...)...) }

	e.ok("sandbox", "create", "old", "--mode", "block", "--", "sleep", "infinity")
	if r := store("forget", "old"); r.code != exitFailed || !strings.Contains(r.stderr, "release or pause it first") {
		t.Fatalf("forget of a running sandbox: exit %d, %q", r.code, r.stderr)
	}
	e.ok("sandbox", "destroy", "old")
	if r := store("gc", "--grace", "1ns"); r.code != 0 || !strings.Contains(r.stdout, "gc deleted nothing") {
		t.Fatalf("gc before forget: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := store("forget", "old"); r.code != 0 || !strings.Contains(r.stdout, "forgot sandboxes/old") {
		t.Fatalf("forget: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := store("gc", "--grace", "1ns", "--dry-run"); r.code != 0 || !strings.Contains(r.stdout, "sandboxes/old/chunks/") || !strings.Contains(r.stdout, "would delete") {
		t.Fatalf("gc --dry-run: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if _, err := repo.Manifest(ctx, blockstore.GenRef{Volume: vol, Generation: 1}); err != nil {
		t.Fatalf("the dry run deleted the manifest: %v", err)
	}
	if r := store("gc", "--grace", "1ns"); r.code != 0 || !strings.Contains(r.stdout, "1 chunk") || !strings.Contains(r.stdout, "1 manifest") {
		t.Fatalf("gc: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if _, err := repo.Manifest(ctx, blockstore.GenRef{Volume: vol, Generation: 1}); !errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("manifest after gc: %v, want not found", err)
	}
}
