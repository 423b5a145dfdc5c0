package node

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
)

// realBlockStore is a block store as ctld's buildBlock makes it: a
// directory store, a node key file, the busybox template imported as
// generation 0, and the real `ctld writer` binary. Claims only read the
// store (a release destroys the dirty data), so one store serves every
// case of a test.
type realBlockStore struct {
	cfg       BlockConfig // StoreDir, NodeKeyFile, NodeKeyID, DeadConnTimeout
	templates storeTemplates
	ctld      string // the ctld binary the writers run as
}

// newRealBlockStore builds the store; the ctld binary is the one the VM
// harness built for the end-to-end tests ($CTLD_BIN_DIR).
func newRealBlockStore(t *testing.T) *realBlockStore {
	t.Helper()
	ktest.RequireNBD(t)
	ctld := filepath.Join(os.Getenv("CTLD_BIN_DIR"), "ctld")
	if fi, err := os.Stat(ctld); os.Getenv("CTLD_BIN_DIR") == "" || err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("ctld binary for the writers not found (CTLD_BIN_DIR=%q): %v; run through make test-vm", os.Getenv("CTLD_BIN_DIR"), err)
	}
	root := t.TempDir()
	nk, raw, err := blockstore.GenerateNodeKey("node")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(root, "blockstore.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(root, "blockstore")
	st, err := dirstore.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{Compression: blockstore.CompressS2})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(root, "busybox")
	if err := template.BuildBusybox(src, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, _, err := template.ImportSource(ctx, repo, "busybox", template.Source{Kind: template.KindDir, Path: src},
		template.ImageOptions{Size: 64 << 20}, root); err != nil {
		t.Fatal(err)
	}
	t.Logf("imported the busybox template into the block store in %v", time.Since(t0).Round(time.Millisecond))
	return &realBlockStore{
		cfg:       BlockConfig{StoreDir: storeDir, NodeKeyFile: keyFile, NodeKeyID: "node", DeadConnTimeout: 30 * time.Second},
		templates: storeTemplates{repo},
		ctld:      ctld,
	}
}

// storeTemplates is ctld's template lookup in the test's store (every
// template the tests name is there).
type storeTemplates struct{ repo *blockstore.Repo }

func (s storeTemplates) Template(ctx context.Context, name string) (blockstore.GenRef, int64, error) {
	ref := blockstore.GenRef{Volume: blockstore.Template(name)}
	m, err := s.repo.Manifest(ctx, ref)
	if err != nil {
		return ref, 0, err
	}
	return ref, int64(m.DeviceSize), nil
}

// realBlockKernel is realKernel whose claims are block-mode ones over
// store: writers (`ctld writer` processes in a cgroup of this test's own)
// under <state>/writers, their devices' ext4 mounted under
// <state>/blockroot, where the leak check looks.
func realBlockKernel(t *testing.T, store *realBlockStore) *testKernel {
	t.Helper()
	k := realKernel(t)
	state := filepath.Dir(k.rootfs.(*rootfs.Overlay).ScratchDir)
	cg := filepath.Join(ktest.CgroupRoot, "ctld-crash-writers-"+randHex(4))
	// After the rig's cleanup (registered later, so run first): a writer
	// left running keeps its cgroup, and that fails here.
	t.Cleanup(func() {
		for i := 0; ; i++ {
			err := unix.Rmdir(cg)
			if err == nil || err == unix.ENOENT {
				return
			}
			if i == 100 {
				t.Errorf("writers' cgroup %s not removable (a writer left running?): %v", cg, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	k.writersDir = filepath.Join(state, "writers")
	k.block = &writer.Supervisor{Binary: store.ctld, Root: k.writersDir, Cgroup: cg}
	k.blockMounts = &rootfs.Block{Dir: filepath.Join(state, "blockroot")}
	k.templates = store.templates
	k.blockStore = store.cfg
	k.blockMode = true
	return k
}
