package writer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/writer"
)

// rig is a writers' root, a cgroup for them and a supervisor that runs
// this test binary as the writer.
type rig struct {
	st  *store
	sup *writer.Supervisor
}

func newRig(t testing.TB) *rig {
	t.Helper()
	ktest.RequireNBD(t)
	ktest.RequireCgroup2(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(ktest.CgroupRoot, "ctld-writer-test")
	t.Cleanup(func() {
		// Writers are gone by now (Stop in the tests' cleanups ran first).
		for i := 0; i < 100; i++ {
			if err := unix.Rmdir(cg); err == nil || errors.Is(err, unix.ENOENT) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("cgroup %s not removable: processes left in it?", cg)
	})
	return &rig{st: newStore(t), sup: &writer.Supervisor{Binary: exe, Root: t.TempDir(), Cgroup: cg}}
}

// start starts a writer for spec and stops it at cleanup.
func (r *rig) start(t testing.TB, spec writer.Spec) writer.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	st, err := r.sup.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("writer pid %d epoch %d on %s (%d bytes), started in %v", st.PID, st.Epoch, st.Device, st.Size, time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() { r.stop(t, spec.Dir, st.Index) })
	return st
}

// stop stops the Dir's writer and proves it gone: no process, the device
// quiescent, no state file.
func (r *rig) stop(t testing.TB, dir string, index int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := r.sup.Stop(ctx, dir); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if ok, detail := r.sup.CheckGone(ctx, dir, index); !ok {
		t.Errorf("CheckGone after Stop: %s", detail)
	} else {
		t.Logf("stopped in %v: %s", time.Since(t0).Round(time.Millisecond), detail)
	}
	if d := time.Since(t0); d > 10*time.Second {
		b, _ := os.ReadFile(filepath.Join(dir, writer.LogName))
		t.Errorf("Stop took %v; the writer's log:\n%s", d.Round(time.Millisecond), b)
	}
	if _, err := os.Stat(filepath.Join(dir, writer.StateName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file after Stop: %v", err)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// mount mounts dev at a temp dir and unmounts it at cleanup.
func mount(t *testing.T, dev string, opts ...string) string {
	t.Helper()
	mnt := t.TempDir()
	run(t, "mount", append(append([]string{"-t", "ext4"}, opts...), dev, mnt)...)
	t.Cleanup(func() { _ = unix.Unmount(mnt, 0) })
	return mnt
}

func umount(t *testing.T, mnt string) {
	t.Helper()
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("umount %s: %v", mnt, err)
	}
}

// A writer over a template generation serves a filesystem; Stop leaves
// the device quiescent and nothing running; a new writer (next epoch)
// over the same Dir finds the synced files.
func TestKernelWriterFilesystemStopRestart(t *testing.T) {
	ktest.RequireBinary(t, "mkfs.ext4")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	base := make([]byte, 64<<10)
	_, _ = rand.Read(base)
	ref := r.st.template(t, "small", 64<<20, map[uint64][]byte{1000: base}) // chunk 1000 = byte 62.5 MiB
	dir := filepath.Join(r.sup.Root, "sb-1")
	st := r.start(t, r.st.spec(ref, dir, 1))
	if st.Size != 64<<20 || st.Device != "/dev/nbd"+strconv.Itoa(st.Index) {
		t.Fatalf("state %+v", st)
	}
	if got, err := r.sup.Check(context.Background(), dir); err != nil || got != st {
		t.Fatalf("Check = %+v, %v; want %+v", got, err, st)
	}
	if cg, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/cgroup"); err != nil || !bytes.Contains(cg, []byte("/ctld-writer-test")) {
		t.Fatalf("writer's cgroup %q (%v): want the supervisor's", cg, err)
	}
	// The base shows through before anything is written.
	got := make([]byte, len(base))
	f, err := os.Open(st.Device)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(got, 1000<<16); err != nil || !bytes.Equal(got, base) {
		t.Fatalf("base chunk through the device: equal %v, %v", bytes.Equal(got, base), err)
	}
	_ = f.Close()

	run(t, "mkfs.ext4", "-q", "-F", st.Device)
	mnt := mount(t, st.Device)
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	if err := writeSync(filepath.Join(mnt, "data"), data); err != nil {
		t.Fatal(err)
	}
	umount(t, mnt)
	r.stop(t, dir, st.Index)

	st2 := r.start(t, r.st.spec(ref, dir, 2))
	mnt = mount(t, st2.Device, "-o", "ro")
	if b, err := os.ReadFile(filepath.Join(mnt, "data")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("after restart: equal %v, %v", bytes.Equal(b, data), err)
	}
	umount(t, mnt)
}

func writeSync(path string, data []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
