package rootfs

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/mountinfo"
)

func kernelOverlay(t *testing.T) (o *Overlay, lower string, logs *bytes.Buffer) {
	t.Helper()
	lower = t.TempDir() // tmpfs in the test VM
	for p, s := range map[string]string{"hello": "template", "sub/keep": "keep"} {
		if err := os.MkdirAll(filepath.Join(lower, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lower, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logs = &bytes.Buffer{}
	o = &Overlay{ScratchDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(logs, nil))}
	// Registered after the temp dirs, so it runs before their removal.
	t.Cleanup(func() {
		for _, id := range []string{"sb-k1", "sb-busy"} {
			if err := o.Unmount(context.Background(), id); err != nil {
				t.Errorf("cleanup unmount %s: %v", id, err)
			}
		}
	})
	return o, lower, logs
}

// mountedOverlay is kernelOverlay with sandbox id's overlay mounted:
// its root and superblock.
func mountedOverlay(t *testing.T, id string) (o *Overlay, logs *bytes.Buffer, root, dev string) {
	t.Helper()
	o, lower, logs := kernelOverlay(t)
	root, err := o.Mount(context.Background(), id, lower)
	if err != nil {
		t.Fatal(err)
	}
	if dev, err = o.Superblock(id); err != nil {
		t.Fatal(err)
	}
	return o, logs, root, dev
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestKernelOverlayMount(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	o, lower, _ := kernelOverlay(t)
	ctx := context.Background()

	root, err := o.Mount(ctx, "sb-k1", lower)
	if err != nil {
		t.Fatal(err)
	}
	again, err := o.Mount(ctx, "sb-k1", lower)
	if err != nil || again != root {
		t.Fatalf("second Mount = %q, %v; want %q, nil", again, err, root)
	}
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		t.Fatal(err)
	}
	if at := mountinfo.At(ms, root); len(at) != 1 || at[0].FSType != "overlay" {
		t.Fatalf("mounts at %s = %+v, want exactly one overlay", root, at)
	}
	if _, err := o.Mount(ctx, "sb-k1", t.TempDir()); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("Mount over another lower = %v, want conflict", err)
	}

	// The guest's view: template content, then its own writes.
	if got := readFile(t, filepath.Join(root, "hello")); got != "template" {
		t.Errorf("root/hello = %q, want template", got)
	}
	if err := os.WriteFile(filepath.Join(root, "hello"), []byte("guest"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "sub", "keep")); err != nil {
		t.Fatal(err)
	}
	// The file API path resolves inside the merged root.
	f, err := OpenInRoot(root, "../../../hello", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(f)
	f.Close()
	if buf.String() != "guest" {
		t.Errorf("OpenInRoot(root, ../../../hello) = %q, want guest", buf.String())
	}

	// Writes landed in upper; lower is untouched.
	upper := filepath.Join(o.Dir("sb-k1"), "upper")
	if got := readFile(t, filepath.Join(upper, "hello")); got != "guest" {
		t.Errorf("upper/hello = %q, want guest", got)
	}
	if got := readFile(t, filepath.Join(upper, "new")); got != "new" {
		t.Errorf("upper/new = %q, want new", got)
	}
	if fi, err := os.Lstat(filepath.Join(upper, "sub", "keep")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("upper/sub/keep should be a whiteout: %v %v", fi, err)
	}
	if got := readFile(t, filepath.Join(lower, "hello")); got != "template" {
		t.Errorf("lower/hello = %q, want template", got)
	}
	if got := readFile(t, filepath.Join(lower, "sub", "keep")); got != "keep" {
		t.Errorf("lower/sub/keep = %q, want keep", got)
	}
	if _, err := os.Stat(filepath.Join(lower, "new")); !os.IsNotExist(err) {
		t.Errorf("lower/new exists: %v", err)
	}

	if ids, err := o.List(ctx); err != nil || len(ids) != 1 || ids[0] != "sb-k1" {
		t.Errorf("List = %v, %v; want [sb-k1]", ids, err)
	}
	if ok, detail := o.CheckGone(ctx, "sb-k1", ""); ok {
		t.Errorf("CheckGone while mounted = true (%s)", detail)
	}
	for i := 0; i < 2; i++ {
		if err := o.Unmount(ctx, "sb-k1"); err != nil {
			t.Fatalf("Unmount #%d: %v", i+1, err)
		}
	}
	if ok, detail := o.CheckGone(ctx, "sb-k1", ""); !ok {
		t.Errorf("CheckGone after Unmount = false: %s", detail)
	}
	if ids, err := o.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List after Unmount = %v, %v; want none", ids, err)
	}
	if got := readFile(t, filepath.Join(lower, "hello")); got != "template" {
		t.Errorf("lower/hello after Unmount = %q, want template", got)
	}
}

// A file held open in the root makes umount return EBUSY; Unmount retries,
// then detaches lazily and says so. The detached overlay lives on while
// the file is open: the proof must say so, naming the holder, and pass
// once it is closed.
func TestKernelOverlayUnmountBusy(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	o, logs, root, dev := mountedOverlay(t, "sb-busy")
	ctx := context.Background()
	f, err := os.Open(filepath.Join(root, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := o.Unmount(ctx, "sb-busy"); err != nil {
		t.Fatalf("Unmount while busy: %v", err)
	}
	if !strings.Contains(logs.String(), "detaching lazily") {
		t.Errorf("no lazy-detach warning in the log:\n%s", logs.String())
	}
	ok, detail := o.CheckGone(ctx, "sb-busy", dev)
	if want := fmt.Sprintf("held by pid %d (fd %d; ", os.Getpid(), f.Fd()); ok || !strings.Contains(detail, want) {
		t.Errorf("CheckGone after lazy detach with a file open = %v, %q; want false, ~%q", ok, detail, want)
	}
	f.Close()
	if ok, detail := o.CheckGone(ctx, "sb-busy", dev); !ok {
		t.Errorf("CheckGone after the holder closed its file = false: %s", detail)
	}
}

// startHolder starts a process that keeps the overlay alive and waits
// until ready(pid) holds; the test's cleanup kills it.
func startHolder(t *testing.T, ready func(pid int) bool, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !ready(cmd.Process.Pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s %v not holding the overlay within 10s", name, args)
		}
	}
	return cmd
}

// stopHolder kills the holder and waits for it to be reaped, so its
// namespace and references are gone.
func stopHolder(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// A process in another mount namespace (unshare -m, private propagation)
// that bind-mounted the root elsewhere keeps the overlay mounted there:
// the unmount in ctld's namespace succeeds at once and does not reach it
// (removing the scratch dir only detaches the copy at the old mount
// point), so the superblock lives on.
func TestKernelOverlayMountedInOtherNamespace(t *testing.T) {
	ktest.Require(t)
	ktest.RequireBinary(t, "unshare")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	o, _, root, dev := mountedOverlay(t, "sb-k1")
	ctx := context.Background()
	hold := t.TempDir()
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	holder := startHolder(t, func(pid int) bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		return ns != self && strings.Contains(string(b), " "+hold+" ")
	}, "unshare", "-m", "--propagation", "private", "sh", "-c", "mount --bind "+root+" "+hold+" && exec sleep 1000")
	if err := o.Unmount(ctx, "sb-k1"); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	ok, detail := o.CheckGone(ctx, "sb-k1", dev)
	if want := fmt.Sprintf("still mounted at %s in mount namespace", hold); ok || !strings.Contains(detail, want) || !strings.Contains(detail, fmt.Sprintf("(pid %d)", holder.Process.Pid)) {
		t.Errorf("CheckGone with the overlay mounted in another namespace = %v, %q; want false, ~%q and pid %d", ok, detail, want, holder.Process.Pid)
	}
	stopHolder(holder)
	if ok, detail := o.CheckGone(ctx, "sb-k1", dev); !ok {
		t.Errorf("CheckGone after the other namespace ended = false: %s", detail)
	}
}

// A process whose cwd is inside the root makes umount busy; after the lazy
// detach its cwd keeps the superblock alive, and the proof names it.
func TestKernelOverlayDetachedHeldByCwd(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	o, _, root, dev := mountedOverlay(t, "sb-busy")
	ctx := context.Background()
	holder := startHolder(t, func(pid int) bool {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		return cwd == filepath.Join(root, "sub")
	}, "sh", "-c", "cd "+filepath.Join(root, "sub")+" && exec sleep 1000")
	if err := o.Unmount(ctx, "sb-busy"); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	ok, detail := o.CheckGone(ctx, "sb-busy", dev)
	// The holder is named with its comm, state and cgroup.
	if want := fmt.Sprintf("held by pid %d (cwd; ", holder.Process.Pid); ok || !strings.Contains(detail, want) || !strings.Contains(detail, ", cgroup /") {
		t.Errorf("CheckGone with a cwd in the detached overlay = %v, %q; want false, ~%q", ok, detail, want)
	}
	stopHolder(holder)
	if ok, detail := o.CheckGone(ctx, "sb-busy", dev); !ok {
		t.Errorf("CheckGone after the holder exited = false: %s", detail)
	}
}

// A mount that fails after the dirs were made rolls them back.
func TestKernelOverlayMountFailureRollsBack(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	o, lower, _ := kernelOverlay(t)
	ctx := context.Background()
	// A file where the merged dir goes makes mount(2) fail with ENOTDIR.
	dir := o.Dir("sb-k1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "root"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Mount(ctx, "sb-k1", lower); err == nil {
		t.Fatal("Mount over a file target succeeded")
	}
	if ok, detail := o.CheckGone(ctx, "sb-k1", ""); !ok {
		t.Errorf("CheckGone after failed Mount = false: %s", detail)
	}
}
