package nbdsrv_test

// The kernel's NBD client (configured by nbd-client over generic netlink)
// against our server, in the test VM: a filesystem made, written, checked
// and read back; FLUSH, TRIM and concurrent requests observed at the backend.

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
	"golang.org/x/sys/unix"
)

// countingBackend counts what reaches the backend.
type countingBackend struct {
	nbdsrv.Backend
	syncs, trims, zeroes atomic.Int64
	cur, max             atomic.Int64
}

func (c *countingBackend) enter() func() {
	n := c.cur.Add(1)
	for m := c.max.Load(); n > m && !c.max.CompareAndSwap(m, n); m = c.max.Load() {
	}
	return func() { c.cur.Add(-1) }
}

func (c *countingBackend) ReadAt(p []byte, off int64) (int, error) {
	defer c.enter()()
	time.Sleep(time.Millisecond) // let concurrent requests overlap visibly
	return c.Backend.ReadAt(p, off)
}

func (c *countingBackend) WriteAt(p []byte, off int64) (int, error) {
	defer c.enter()()
	return c.Backend.WriteAt(p, off)
}

func (c *countingBackend) Sync() error { c.syncs.Add(1); return c.Backend.Sync() }

func (c *countingBackend) Trim(off, n int64) error { c.trims.Add(1); return c.Backend.Trim(off, n) }

func (c *countingBackend) WriteZeroes(off, n int64, noHole bool) error {
	c.zeroes.Add(1)
	return c.Backend.WriteZeroes(off, n, noHole)
}

// freeNBD returns the highest-numbered nbd device without a connection
// (test/kernel takes the lowest), waiting out one whose release is still
// under way.
func freeNBD(t *testing.T) string {
	t.Helper()
	var names []string
	for _, e := range dirEntries(t, "/sys/block") {
		if strings.HasPrefix(e, "nbd") {
			names = append(names, e)
		}
	}
	idx := func(n string) int { i, _ := strconv.Atoi(strings.TrimPrefix(n, "nbd")); return i }
	best := ""
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/sys/block", n, "pid")); os.IsNotExist(err) && (best == "" || idx(n) > idx(best)) {
			best = n
		}
	}
	if best == "" {
		t.Fatalf("no free nbd device among %v", names)
	}
	return best
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func sysBlock(t *testing.T, dev, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", dev, attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// checkExportFlags: the kernel took the export flags, a write cache
// (FLUSH/FUA) and discard.
func checkExportFlags(t *testing.T, dev string) {
	t.Helper()
	if wc := sysBlock(t, dev, "queue/write_cache"); wc != "write back" {
		t.Errorf("%s write_cache %q: the kernel did not take NBD_FLAG_SEND_FLUSH", dev, wc)
	}
	if d := sysBlock(t, dev, "queue/discard_max_bytes"); d == "0" {
		t.Errorf("%s discard_max_bytes 0: the kernel did not take NBD_FLAG_SEND_TRIM", dev)
	}
}

// ext4On is an ext4 filesystem made on /dev/<dev> and mounted at mnt; the
// test's cleanup unmounts it if the test left it mounted.
type ext4On struct {
	t        *testing.T
	dev, mnt string
	mounted  bool
}

func mkfsMount(t *testing.T, dev string) *ext4On {
	t.Helper()
	run(t, "mkfs.ext4", "-q", "-F", "/dev/"+dev)
	fs := &ext4On{t: t, dev: dev, mnt: t.TempDir()}
	fs.mount()
	t.Cleanup(func() {
		if fs.mounted {
			_ = unix.Unmount(fs.mnt, 0)
		}
	})
	return fs
}

func (fs *ext4On) mount(opts ...string) {
	fs.t.Helper()
	run(fs.t, "mount", append(append([]string{"-t", "ext4"}, opts...), "/dev/"+fs.dev, fs.mnt)...)
	fs.mounted = true
}

func (fs *ext4On) umount() {
	fs.t.Helper()
	run(fs.t, "umount", fs.mnt)
	fs.mounted = false
}

// writeRandom creates name in the filesystem holding n random bytes, not
// yet synced: the caller syncs and closes f.
func (fs *ext4On) writeRandom(name string, n int) (path string, data []byte, f *os.File) {
	fs.t.Helper()
	data = make([]byte, n)
	_, _ = rand.Read(data)
	path = filepath.Join(fs.mnt, name)
	f, err := os.Create(path)
	if err != nil {
		fs.t.Fatal(err)
	}
	fs.t.Cleanup(func() { _ = f.Close() })
	if _, err := f.Write(data); err != nil {
		fs.t.Fatal(err)
	}
	return path, data, f
}

// mountUncachedRO drops the device's buffers and mounts it read-only: what
// is read next comes from the NBD server.
func (fs *ext4On) mountUncachedRO() {
	fs.t.Helper()
	run(fs.t, "blockdev", "--flushbufs", "/dev/"+fs.dev)
	fs.mount("-o", "ro")
}

func TestKernelClientFilesystemFlushTrim(t *testing.T) {
	ktest.RequireNBD(t)
	nbdClient := ktest.RequireBinary(t, "nbd-client")
	ktest.RequireBinary(t, "mkfs.ext4")
	ktest.RequireBinary(t, "blkdiscard")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})

	const size = 128 << 20
	img := filepath.Join(t.TempDir(), "disk.img")
	sparseFile(t, img, size)
	f, err := nbdsrv.OpenFile(img, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	cb := &countingBackend{Backend: f}
	s := nbdtest.Serve(t, nbdsrv.Export{Name: "test", Backend: cb}, nbdsrv.Options{})

	dev := freeNBD(t)
	run(t, nbdClient, "-unix", s.Sock, "/dev/"+dev, "-N", "test", "-b", "4096", "-connections", "2", "-timeout", "30")
	disconnected := false
	disconnect := func() {
		if disconnected {
			return
		}
		disconnected = true
		run(t, nbdClient, "-d", "/dev/"+dev)
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join("/sys/block", dev, "pid")); os.IsNotExist(err) && sysBlock(t, dev, "size") == "0" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not released 15s after nbd-client -d", dev)
			}
		}
	}
	t.Cleanup(disconnect) // before serve's stop and the leak check (last-in first-out)

	if got := sysBlock(t, dev, "size"); got != strconv.Itoa(size/512) {
		t.Fatalf("%s size %s sectors, want %d", dev, got, size/512)
	}
	checkExportFlags(t, dev)
	t.Logf("%s: write_zeroes_max_bytes %s, fua %s", dev, sysBlock(t, dev, "queue/write_zeroes_max_bytes"), sysBlock(t, dev, "queue/fua"))

	// A filesystem: mkfs discards the device first (TRIM), fsync flushes.
	fs := mkfsMount(t, dev)
	fp, data, wf := fs.writeRandom("data", 16<<20)
	syncsBefore := cb.syncs.Load()
	if err := wf.Sync(); err != nil {
		t.Fatalf("fsync on the nbd filesystem: %v", err)
	}
	_ = wf.Close()
	if cb.syncs.Load() == syncsBefore {
		t.Errorf("fsync on the nbd filesystem sent no FLUSH to the server")
	}
	fs.umount()
	run(t, "e2fsck", "-f", "-n", "/dev/"+dev)
	// Read back after dropping the device's cache: the data comes from us.
	fs.mountUncachedRO()
	got, err := os.ReadFile(fp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("file read back from the nbd filesystem differs")
	}
	fs.umount()

	// Concurrent direct reads reach the server concurrently.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fd, err := unix.Open("/dev/"+dev, unix.O_RDONLY|unix.O_DIRECT, 0)
			if err != nil {
				errs <- err
				return
			}
			defer unix.Close(fd)
			buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				errs <- err
				return
			}
			defer unix.Munmap(buf)
			for j := range 8 {
				if _, err := unix.Pread(fd, buf, int64(i*8+j)<<20); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("direct read: %v", err)
	}
	if m := cb.max.Load(); m < 2 {
		t.Errorf("at most %d request in the backend at once: not served concurrently", m)
	}

	// A discarded range reads as zeros through the device and is a hole in
	// the file behind the server.
	const off, n = 96 << 20, 4 << 20
	fd, err := unix.Open("/dev/"+dev, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, bytes.Repeat([]byte{0x5a}, n))
	if _, err := unix.Pwrite(fd, buf, off); err != nil {
		t.Fatalf("direct write: %v", err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatalf("fsync device: %v", err)
	}
	_ = unix.Close(fd)
	_ = unix.Munmap(buf)
	if b, err := os.ReadFile(img); err != nil || b[off] != 0x5a || b[off+n-1] != 0x5a {
		t.Fatalf("direct write did not reach the file behind the server (%v)", err)
	}
	trimsBefore := cb.trims.Load()
	run(t, "blkdiscard", "-o", strconv.Itoa(off), "-l", strconv.Itoa(n), "/dev/"+dev)
	if cb.trims.Load() == trimsBefore {
		t.Fatal("blkdiscard sent no TRIM to the server")
	}
	run(t, "blockdev", "--flushbufs", "/dev/"+dev)
	fd, err = unix.Open("/dev/"+dev, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err = unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	_, rerr := unix.Pread(fd, buf, off)
	_ = unix.Close(fd)
	zero := bytes.Count(buf, []byte{0}) == len(buf)
	_ = unix.Munmap(buf)
	if rerr != nil || !zero {
		t.Fatalf("discarded range: read error %v, all zeros %v", rerr, zero)
	}
	hf, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	if h, err := unix.Seek(int(hf.Fd()), off, unix.SEEK_HOLE); err != nil || h != off {
		t.Errorf("discarded range: first hole at/after %d is %d (%v): not punched", off, h, err)
	}
	t.Logf("backend saw %d flushes, %d trims, %d write-zeroes, at most %d requests at once",
		cb.syncs.Load(), cb.trims.Load(), cb.zeroes.Load(), cb.max.Load())
	disconnect()
}
