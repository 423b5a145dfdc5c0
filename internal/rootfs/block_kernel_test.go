package rootfs

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
)

// A block root with a mount below it (as a guest's tool could leave) is
// unmounted deepest first: no EBUSY retries, no lazy detach, and the
// cleanup proof then finds the filesystem mounted nowhere and unheld.
// (tmpfs stands in for the NBD device's ext4: the unmount and the proof
// do not care which filesystem it is.)
func TestKernelBlockUnmountNested(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	logs := &bytes.Buffer{}
	b := &Block{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(logs, nil))}
	ctx := context.Background()
	target := b.Target("sb-kb")
	sub := filepath.Join(target, "sub")
	t.Cleanup(func() {
		_ = unix.Unmount(target, unix.MNT_DETACH)
	})
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if ids, err := b.List(ctx); err != nil || len(ids) != 1 || ids[0] != "sb-kb" {
		t.Fatalf("List = %v, %v; want [sb-kb]", ids, err)
	}
	dev, err := b.Superblock("sb-kb")
	if err != nil {
		t.Fatal(err)
	}
	if ok, detail := b.CheckGone(ctx, "sb-kb", dev); ok {
		t.Fatalf("CheckGone while mounted = true: %s", detail)
	}
	if err := b.Unmount(ctx, "sb-kb"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "detaching lazily") {
		t.Errorf("Unmount detached lazily, want every mount unmounted in order: %s", logs)
	}
	if ok, detail := b.CheckGone(ctx, "sb-kb", dev); !ok {
		t.Errorf("CheckGone after Unmount = false: %s", detail)
	} else {
		t.Log(detail)
	}
}
