package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelOverlayDiskLimit: the overlay root of a sandbox whose scratch
// dir is limited takes writes up to the limit and refuses the rest (the
// upper inherits the project); unmount, then unlimit, leaves the project
// empty, which is what the cleanup proof checks.
func TestKernelOverlayDiskLimit(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	mnt := ktest.LoopFS(t, "xfs", 320, "prjquota")
	o, lower, _ := kernelOverlay(t)
	o.ScratchDir = filepath.Join(mnt, "scratch")
	ctx := context.Background()
	const id, project, limit = "sb-k1", 77001, 16 << 20

	if err := o.DiskBounded(); err != nil {
		t.Fatalf("DiskBounded on xfs prjquota: %v", err)
	}
	if err := o.LimitDisk(ctx, id, project, limit); err != nil {
		t.Fatal(err)
	}
	if err := o.LimitDisk(ctx, id, project, limit); err != nil {
		t.Fatalf("LimitDisk again (idempotent): %v", err)
	}
	root, err := o.Mount(ctx, id, lower)
	if err != nil {
		t.Fatal(err)
	}
	if p, inherit, err := diskquota.Project(filepath.Join(o.Dir(id), upperName)); err != nil || p != project || !inherit {
		t.Fatalf("upper dir project %d inherit %v (%v), want %d inherited", p, inherit, err, project)
	}
	// Writing through the overlay (a copy-up of a template file, then a new
	// file) is charged to the project and stops at the limit.
	if err := os.WriteFile(filepath.Join(root, "hello"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(root, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	var n int64
	for n < 1<<30 {
		w, werr := f.Write(buf)
		n += int64(w)
		if werr != nil {
			err = werr
			break
		}
	}
	f.Close()
	if !errors.Is(err, unix.ENOSPC) || n > limit || n < limit-512<<10 {
		t.Fatalf("overlay write stopped after %d bytes with %v; want ENOSPC within 512 KiB below %d", n, err, limit)
	}
	t.Logf("overlay took %d bytes under a %d-byte disk limit, then %v", n, limit, err)

	// Refused while the data is there; the proof says so.
	if ok, d := o.CheckDiskGone(ctx, project); ok {
		t.Fatalf("CheckDiskGone with data in the upper: ok (%s)", d)
	}
	if err := o.Unmount(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := o.UnlimitDisk(ctx, project); err != nil {
		t.Fatal(err)
	}
	if err := o.UnlimitDisk(ctx, project); err != nil {
		t.Fatalf("UnlimitDisk again (idempotent): %v", err)
	}
	if ok, d := o.CheckDiskGone(ctx, project); !ok {
		t.Fatalf("CheckDiskGone after teardown: %s", d)
	}
	if qs, err := o.DiskProjects(ctx, 1, ^uint32(0)); err != nil || len(qs) != 0 {
		t.Fatalf("projects left: %+v, %v", qs, err)
	}
}

// TestKernelDiskLimitKeptWhileDataRemains: unlimit refuses (and keeps the
// limit) while files of the project remain.
func TestKernelDiskLimitKeptWhileDataRemains(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	mnt := ktest.LoopFS(t, "xfs", 320, "prjquota")
	o := &Overlay{ScratchDir: filepath.Join(mnt, "scratch")}
	ctx := context.Background()
	const id, project = "sb-k2", 77002
	if err := o.LimitDisk(ctx, id, project, 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.Dir(id), "x"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cx, cancel := context.WithTimeout(ctx, 300e6) // do not wait the full settle time
	defer cancel()
	if err := o.UnlimitDisk(cx, project); err == nil {
		t.Fatal("UnlimitDisk with 1 MiB left: nil error")
	}
	if q, _ := diskquota.Get(o.ScratchDir, project); q.LimitBytes != 4<<20 {
		t.Fatalf("limit after a refused unlimit: %+v, want kept", q)
	}
	// A second generation must not take a project that holds data.
	if err := o.LimitDisk(ctx, "sb-k3", project, 4<<20); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("LimitDisk of a used project for another sandbox: %v, want conflict", err)
	}
	// RemoveScratch takes only an empty scratch dir (a claim that never
	// mounted its overlay); content is Unmount's to remove.
	if err := o.RemoveScratch(id); err == nil {
		t.Fatal("RemoveScratch of a dir with data: nil error")
	}
	if err := os.Remove(filepath.Join(o.Dir(id), "x")); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{id, "sb-k3"} {
		if err := o.RemoveScratch(sb); err != nil {
			t.Fatalf("RemoveScratch of an empty dir: %v", err)
		}
		if _, err := os.Stat(o.Dir(sb)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("scratch dir after RemoveScratch: %v", err)
		}
	}
	if err := o.RemoveScratch(id); err != nil {
		t.Fatalf("RemoveScratch of an absent dir: %v", err)
	}
	if err := o.UnlimitDisk(ctx, project); err != nil {
		t.Fatal(err)
	}
}

// TestKernelDiskBoundedRefusesTmpfs: a scratch dir that cannot enforce a
// disk lease is refused with a clear error naming it and the fix.
func TestKernelDiskBoundedRefusesTmpfs(t *testing.T) {
	ktest.Require(t)
	o := &Overlay{ScratchDir: filepath.Join(t.TempDir(), "scratch")}
	err := o.DiskBounded()
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "tmpfs") || !strings.Contains(err.Error(), "prjquota") {
		t.Fatalf("DiskBounded on tmpfs: %v; want unavailable naming tmpfs and prjquota", err)
	}
	if err := o.LimitDisk(context.Background(), "sb-k4", 77003, 4<<20); err == nil {
		t.Fatal("LimitDisk on tmpfs succeeded")
	}
}
