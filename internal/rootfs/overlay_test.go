package rootfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"golang.org/x/sys/unix"
)

func TestPlan(t *testing.T) {
	o := &Overlay{ScratchDir: "/var/lib/ctld/scratch/"}
	got := o.Plan("sb-1", "/var/lib/ctld/templates/base/")
	want := Mount{
		Source: "overlay",
		Target: "/var/lib/ctld/scratch/sb-1/root",
		FSType: "overlay",
		Options: []string{
			"lowerdir=/var/lib/ctld/templates/base",
			"upperdir=/var/lib/ctld/scratch/sb-1/upper",
			"workdir=/var/lib/ctld/scratch/sb-1/work",
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Plan:\n got %+v\nwant %+v", got, want)
	}
	if d := got.Data(); d != "lowerdir=/var/lib/ctld/templates/base,upperdir=/var/lib/ctld/scratch/sb-1/upper,workdir=/var/lib/ctld/scratch/sb-1/work" {
		t.Errorf("Data = %q", d)
	}
}

// Bad ids and paths are refused before anything is created.
func TestMountRejectsBadInput(t *testing.T) {
	scratch := t.TempDir()
	lower := t.TempDir()
	o := &Overlay{ScratchDir: scratch}
	ctx := context.Background()
	for _, c := range []struct{ id, lower string }{
		{"", lower},
		{"../x", lower},
		{"A", lower},
		{"a/b", lower},
		{"sb", "relative/dir"},
		{"sb", "/tmp/a,upperdir=/etc"},
		{"sb", "/tmp/a:/tmp/b"},
		{"sb", "/tmp/a b"},
	} {
		_, err := o.Mount(ctx, c.id, c.lower)
		if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("Mount(%q, %q) = %v, want invalid_argument", c.id, c.lower, err)
		}
	}
	for _, id := range []string{"", "..", "a/../b"} {
		if err := o.Unmount(ctx, id); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("Unmount(%q) = %v, want invalid_argument", id, err)
		}
		if ok, _ := o.CheckGone(ctx, id, ""); ok {
			t.Errorf("CheckGone(%q) = true for an invalid id", id)
		}
	}
	if ents, _ := os.ReadDir(scratch); len(ents) != 0 {
		t.Errorf("scratch dir not empty after refused mounts: %v", ents)
	}
	bad := &Overlay{ScratchDir: "/tmp/scr,atch"}
	if _, err := bad.Mount(ctx, "sb", lower); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("Mount with scratch dir containing ',' = %v, want invalid_argument", err)
	}
}

// writeMountinfo renders a fake mount table so List, CheckGone and
// Unmount's safety check can be tested without mounting.
func writeMountinfo(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mountinfo")
	base := "1 0 0:1 / / rw - rootfs rootfs rw\n"
	if err := os.WriteFile(p, []byte(base+strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMounted: only an overlay at <scratch>/<id>/root counts as a mounted
// root (not a scratch dir, another filesystem there, a mount below the
// root, or one outside the scratch dir).
func TestMounted(t *testing.T) {
	scratch := t.TempDir()
	if err := os.Mkdir(filepath.Join(scratch, "sb-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	mi := writeMountinfo(t,
		"40 1 0:33 / "+scratch+"/sb-mounted/root rw - overlay overlay rw,lowerdir=/t,upperdir=/u,workdir=/w",
		"41 1 0:34 / "+scratch+"-other/sb-x/root rw - overlay overlay rw",
		"42 1 0:35 / "+scratch+"/sb-tmpfs/root rw - tmpfs tmpfs rw",
		"43 1 0:36 / "+scratch+"/sb-deep/root/proc rw - overlay overlay rw",
	)
	o := &Overlay{ScratchDir: scratch, MountinfoPath: mi}
	if ids, err := o.Mounted(context.Background()); err != nil || !reflect.DeepEqual(ids, []string{"sb-mounted"}) {
		t.Errorf("Mounted = %v, %v; want [sb-mounted]", ids, err)
	}
}

func TestListAndCheckGone(t *testing.T) {
	scratch := t.TempDir()
	ctx := context.Background()
	for _, d := range []string{"sb-dir", "Not_An_ID"} {
		if err := os.Mkdir(filepath.Join(scratch, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mi := writeMountinfo(t,
		"40 1 0:33 / "+scratch+"/sb-mounted/root rw - overlay overlay rw,lowerdir=/t,upperdir=/u,workdir=/w",
		"41 1 0:34 / "+scratch+"-other/sb-x rw - tmpfs tmpfs rw",
	)
	o := &Overlay{ScratchDir: scratch, MountinfoPath: mi, ProcRoot: t.TempDir()}
	ids, err := o.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"sb-dir", "sb-mounted"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("List = %v, want %v", ids, want)
	}

	for _, c := range []struct {
		id     string
		ok     bool
		detail string
	}{
		{"sb-dir", false, "dir still exists"},
		{"sb-mounted", false, "mount(s) left"},
		{"sb-gone", true, "dir is gone"},
	} {
		ok, detail := o.CheckGone(ctx, c.id, "")
		if ok != c.ok || !strings.Contains(detail, c.detail) {
			t.Errorf("CheckGone(%q) = %v, %q; want %v, ~%q", c.id, ok, detail, c.ok, c.detail)
		}
	}
	// Unmount of a dir-only sandbox removes the dir and is idempotent.
	for i := 0; i < 2; i++ {
		if err := o.Unmount(ctx, "sb-dir"); err != nil {
			t.Fatalf("Unmount #%d: %v", i+1, err)
		}
	}
	if ok, detail := o.CheckGone(ctx, "sb-dir", ""); !ok {
		t.Errorf("after Unmount: CheckGone = false: %s", detail)
	}
}

// Unmount never removes a dir that (per mountinfo) still has a mount in
// it: here the fake table says so and the unmount itself reports "not
// mounted", so the dir must stay and the error say why.
func TestUnmountRefusesToRemoveMountedDir(t *testing.T) {
	scratch := t.TempDir()
	root := filepath.Join(scratch, "sb", "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	o := &Overlay{ScratchDir: scratch, MountinfoPath: writeMountinfo(t,
		"40 1 0:33 / "+root+" rw - overlay overlay rw,lowerdir=/t,upperdir=/u,workdir=/w")}
	err := o.Unmount(context.Background(), "sb")
	if err == nil {
		t.Fatal("Unmount = nil, want an error")
	}
	// As non-root the umount itself fails first (EPERM); either way the
	// dir must stay.
	if os.Geteuid() == 0 && !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("Unmount = %v, want a 'still mounted' error", err)
	}
	if _, err := os.Stat(root); err != nil {
		t.Errorf("dir removed although mountinfo shows a mount: %v", err)
	}
}

// fakeProcess is one process of a fake /proc: its mount namespace, mount
// table and cwd (a real dir, so stat through the link gives its device).
type fakeProcess struct {
	mntNS, mountinfo, cwd string
}

func fakeProc(t *testing.T, procs map[int]fakeProcess) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		for _, d := range []string{"ns", "fd"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(p.mntNS, filepath.Join(dir, "ns", "mnt")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "mountinfo"), []byte("1 0 0:1 / / rw - rootfs rootfs rw\n"+p.mountinfo), 0o644); err != nil {
			t.Fatal(err)
		}
		if p.cwd != "" {
			if err := os.Symlink(p.cwd, filepath.Join(dir, "cwd")); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// The superblock check looks in every mount namespace and at every
// process's cwd and files; a device number that now belongs to another
// filesystem is not ours.
func TestCheckGoneSuperblock(t *testing.T) {
	ctx := context.Background()
	scratch := t.TempDir()
	mi := writeMountinfo(t)
	o := &Overlay{ScratchDir: scratch, MountinfoPath: mi}
	upper := filepath.Join(o.Dir("sb-x"), "upper")
	held := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(held, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	ours := "50 1 0:99 / /elsewhere rw - overlay overlay rw,lowerdir=/t,upperdir=" + upper + ",workdir=/w\n"
	other := "51 1 " + dev + " / /data rw - tmpfs tmpfs rw\n"
	for _, c := range []struct {
		name   string
		procs  map[int]fakeProcess
		dev    string
		ok     bool
		detail string
	}{
		{"no processes", nil, dev, true, "held by no process"},
		{"mounted in another namespace", map[int]fakeProcess{1: {mntNS: "mnt:[1]"}, 10: {mntNS: "mnt:[2]", mountinfo: ours}}, dev, false, "still mounted at /elsewhere in mount namespace mnt:[2] (pid 10)"},
		{"detached, held by a cwd", map[int]fakeProcess{11: {mntNS: "mnt:[1]", cwd: held}}, dev, false, "detached but alive: held by pid 11 (cwd)"},
		{"device reused", map[int]fakeProcess{11: {mntNS: "mnt:[1]", mountinfo: other, cwd: held}}, dev, true, "belongs to another filesystem"},
		{"device not recorded", map[int]fakeProcess{11: {mntNS: "mnt:[1]", cwd: held}}, "", true, "not recorded"},
	} {
		o.ProcRoot = fakeProc(t, c.procs)
		ok, detail := o.CheckGone(ctx, "sb-x", c.dev)
		if ok != c.ok || !strings.Contains(detail, c.detail) {
			t.Errorf("%s: CheckGone = %v, %q; want %v, ~%q", c.name, ok, detail, c.ok, c.detail)
		}
	}
}
