package rootfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
)

// The block roots' inventory and cleanup proof from a fake mount table:
// List counts mount points and mounts, Mounted only an ext4 at
// <Dir>/<id>, CheckGone wants the mount and the mount point gone and,
// with the device known, no mount of it anywhere and no holder.
func TestBlockListMountedCheckGone(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{"sb-dir", "Not_An_ID"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mi := writeMountinfo(t,
		"40 1 43:0 / "+dir+"/sb-mounted rw - ext4 /dev/nbd0 rw",
		"41 1 0:34 / "+dir+"-other/sb-x rw - ext4 /dev/nbd1 rw",
		"42 1 0:35 / "+dir+"/sb-tmpfs rw - tmpfs tmpfs rw",
		"43 1 43:32 / "+dir+"/sb-deep/proc rw - ext4 /dev/nbd2 rw",
	)
	b := &Block{Dir: dir, MountinfoPath: mi, ProcRoot: t.TempDir()}
	if ids, err := b.List(ctx); err != nil || !reflect.DeepEqual(ids, []string{"sb-deep", "sb-dir", "sb-mounted", "sb-tmpfs"}) {
		t.Errorf("List = %v, %v", ids, err)
	}
	if ids, err := b.Mounted(ctx); err != nil || !reflect.DeepEqual(ids, []string{"sb-mounted"}) {
		t.Errorf("Mounted = %v, %v; want [sb-mounted]", ids, err)
	}
	if dev, err := b.Superblock("sb-mounted"); err != nil || dev != "43:0" {
		t.Errorf("Superblock = %q, %v; want 43:0", dev, err)
	}
	if _, err := b.Superblock("sb-dir"); err == nil {
		t.Error("Superblock of an unmounted root: no error")
	}

	held := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(held, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	elsewhere := "50 1 " + dev + " / /elsewhere rw - ext4 /dev/nbd3 rw\n"
	for _, c := range []struct {
		name, id, dev string
		procs         map[int]fakeProcess
		ok            bool
		detail        string
	}{
		{"mount point left", "sb-dir", "", nil, false, "the mount point still exists"},
		{"still mounted", "sb-mounted", "", nil, false, "1 mount(s) left at or under " + dir + "/sb-mounted, first " + dir + "/sb-mounted (ext4 from /dev/nbd0)"},
		{"device not recorded", "sb-gone", "", nil, true, "device not recorded"},
		{"no processes", "sb-gone", dev, nil, true, "mounted in none of 0 mount namespaces and held by no process"},
		{"mounted in another namespace", "sb-gone", dev, map[int]fakeProcess{10: {mntNS: "mnt:[2]", mountinfo: elsewhere}}, false, "device " + dev + " (/dev/nbd3) still mounted at /elsewhere in mount namespace mnt:[2] (pid 10)"},
		{"detached, held by a cwd", "sb-gone", dev, map[int]fakeProcess{11: {mntNS: "mnt:[1]", cwd: held}}, false, "filesystem of device " + dev + " is detached but alive: held by pid 11 (cwd)"},
		{"bad device", "sb-gone", "x", nil, false, `bad device number "x"`},
	} {
		b.ProcRoot = fakeProc(t, c.procs)
		ok, detail := b.CheckGone(ctx, c.id, c.dev)
		if ok != c.ok || !strings.Contains(detail, c.detail) {
			t.Errorf("%s: CheckGone = %v, %q; want %v, ~%q", c.name, ok, detail, c.ok, c.detail)
		}
	}
	if ok, _ := b.CheckGone(ctx, "../x", ""); ok {
		t.Error("CheckGone of an invalid id = true")
	}
}

// Unmount removes an unmounted mount point and is idempotent; a mount
// point the table (still) shows mounted is never removed.
func TestBlockUnmount(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{"sb-dir", "sb-mounted"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b := &Block{Dir: dir, MountinfoPath: writeMountinfo(t, "40 1 43:0 / "+dir+"/sb-mounted rw - ext4 /dev/nbd0 rw")}
	for i := 0; i < 2; i++ {
		if err := b.Unmount(ctx, "sb-dir"); err != nil {
			t.Fatalf("Unmount #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sb-dir")); !os.IsNotExist(err) {
		t.Errorf("mount point after Unmount: %v", err)
	}
	err := b.Unmount(ctx, "sb-mounted")
	// As non-root the umount itself fails first (EPERM); either way the
	// mount point must stay.
	if err == nil || os.Geteuid() == 0 && !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("Unmount of a mounted root = %v, want a 'still mounted' error", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sb-mounted")); err != nil {
		t.Errorf("mount point removed although mountinfo shows a mount: %v", err)
	}
	if err := b.Unmount(ctx, "a/b"); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("Unmount of an invalid id = %v, want invalid_argument", err)
	}
}
