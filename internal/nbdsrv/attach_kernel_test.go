package nbdsrv_test

// The kernel device configured by our own generic-netlink attach (no
// nbd-client): a filesystem through it, a quiescent release, and I/O
// errors once the dead-connection timeout passes without a reconnect.

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/nbdsrv"
	"golang.org/x/sys/unix"
)

// pairServed is one socketpair whose server end is served until kill.
type pairServed struct {
	client *net.UnixConn
	ended  chan error // ServeConn's result once it returns
	kill   func()     // closes the serving side, as a dead primary's exit would
}

func servePair(t *testing.T, srv *nbdsrv.Server) *pairServed {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "nbd-pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	sc, cc := conn(fds[0]), conn(fds[1])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ended := make(chan error, 1)
	go func() { err := srv.ServeConn(ctx, sc); ended <- err; done <- err }()
	killed := false
	kill := func() {
		if killed {
			return
		}
		killed = true
		cancel()
		_ = sc.Close() // at once, in-flight requests unanswered
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("ServeConn did not return 20s after its socket closed")
		}
	}
	t.Cleanup(kill)
	return &pairServed{client: cc, ended: ended, kill: kill}
}

// attach negotiates on a fresh pair and connects the kernel device.
func attach(t *testing.T, devs *nbdsrv.Devices, srv *nbdsrv.Server, cfg nbdsrv.DeviceConfig) (int, *pairServed) {
	t.Helper()
	p := servePair(t, srv)
	info, err := nbdsrv.Negotiate(p.client, "test", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Info = info
	idx, err := devs.Connect(cfg, p.client)
	_ = p.client.Close() // the kernel holds its own reference
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { release(t, devs, idx) })
	t.Cleanup(func() { delete(released, idx) }) // runs first: this test's release is due
	return idx, p
}

// released marks devices this test already released (tests run one at a time).
var released = map[int]bool{}

// release disconnects once and waits until the device is quiescent.
func release(t *testing.T, devs *nbdsrv.Devices, idx int) {
	t.Helper()
	if released[idx] {
		return
	}
	released[idx] = true
	start := time.Now()
	if err := devs.Disconnect(idx); err != nil {
		t.Errorf("disconnect: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := nbdsrv.WaitQuiescent(ctx, devs, "/sys/block", idx); err != nil {
		t.Errorf("after disconnect: %v", err)
		return
	}
	t.Logf("nbd%d quiescent %v after disconnect", idx, time.Since(start).Round(time.Millisecond))
}

func newFileServer(t *testing.T, size int64) (*nbdsrv.Server, string) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	sparseFile(t, img, size)
	f, err := nbdsrv.OpenFile(img, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	srv, err := nbdsrv.New(nbdsrv.Export{Name: "test", Backend: f}, nbdsrv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return srv, img
}

func openDevices(t *testing.T) *nbdsrv.Devices {
	t.Helper()
	devs, err := nbdsrv.OpenDevices()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = devs.Close() })
	return devs
}

func TestKernelAttachFilesystemAndRelease(t *testing.T) {
	ktest.RequireNBD(t)
	ktest.RequireBinary(t, "mkfs.ext4")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	const size = 64 << 20
	srv, _ := newFileServer(t, size)
	devs := openDevices(t)
	idx, _ := attach(t, devs, srv, nbdsrv.DeviceConfig{Index: nbdsrv.AnyIndex, Timeout: 30 * time.Second, DeadConnTimeout: 5 * time.Second})
	dev := "nbd" + strconv.Itoa(idx)
	t.Logf("kernel chose %s", dev)
	if st, err := devs.Status(idx); err != nil || !st.Connected {
		t.Fatalf("status %+v, %v: want connected", st, err)
	}
	if got := sysBlock(t, dev, "size"); got != strconv.Itoa(size/512) {
		t.Fatalf("%s size %s sectors, want %d", dev, got, size/512)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", dev, "pid")); err != nil {
		t.Fatalf("%s pid: %v", dev, err)
	}
	checkExportFlags(t, dev)
	if q, err := nbdsrv.ReadQuiescence(devs, "/sys/block", idx); err != nil || q.Quiet() {
		t.Fatalf("attached device reads as quiet (%v, %v)", q, err)
	}

	fs := mkfsMount(t, dev)
	// Mounted: the filesystem holds the device, so it is not quiescent.
	fp, data, wf := fs.writeRandom("data", 4<<20)
	if err := wf.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	_ = wf.Close()
	fs.umount()
	fs.mountUncachedRO()
	got, err := os.ReadFile(fp)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back through the device: equal %v, %v", bytes.Equal(got, data), err)
	}
	fs.umount()

	release(t, devs, idx)
	q, err := nbdsrv.ReadQuiescence(devs, "/sys/block", idx)
	if err != nil || !q.Quiet() {
		t.Fatalf("after release: %v, %v", q, err)
	}
}

// writer writes 64 KiB O_DIRECT blocks in a loop, slot i%slots filled with
// byte(i), until stop; it records the first error.
type writer struct {
	n    atomic.Int64
	err  atomic.Value
	stop atomic.Bool
	done chan struct{}
}

const wBlock, wSlots = 64 << 10, 64

func startWriter(t *testing.T, dev string) *writer {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, wBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer unix.Munmap(buf)
		defer unix.Close(fd)
		for i := int64(0); !w.stop.Load(); i++ {
			for j := range buf {
				buf[j] = byte(i)
			}
			if _, err := unix.Pwrite(fd, buf, (i%wSlots)*wBlock); err != nil {
				w.err.Store(err)
				return
			}
			w.n.Store(i + 1)
		}
	}()
	t.Cleanup(func() { w.stop.Store(true); <-w.done })
	return w
}

func (w *writer) waitWrites(t *testing.T, more int64, what string) {
	t.Helper()
	want := w.n.Load() + more
	for deadline := time.Now().Add(30 * time.Second); w.n.Load() < want; time.Sleep(10 * time.Millisecond) {
		if e, _ := w.err.Load().(error); e != nil {
			t.Fatalf("%s: writer saw %v after %d writes", what, e, w.n.Load())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: writer stuck at %d writes", what, w.n.Load())
		}
	}
}

func TestKernelAttachDeadConnTimeout(t *testing.T) {
	ktest.RequireNBD(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	srv, _ := newFileServer(t, 16<<20)
	devs := openDevices(t)
	const dead = 2 * time.Second
	// 6.1 marks the socket dead only on a failed send or a request
	// timeout, not on the receive error: a request in flight when the
	// server dies waits out Timeout first, so keep it short.
	idx, old := attach(t, devs, srv, nbdsrv.DeviceConfig{Index: nbdsrv.AnyIndex, Timeout: 3 * time.Second, DeadConnTimeout: dead})
	dev := "/dev/nbd" + strconv.Itoa(idx)
	w := startWriter(t, dev)
	w.waitWrites(t, 20, "before the server died")
	old.kill()
	killed := time.Now()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatal("writer still blocked 30s after the server died: the dead-connection timeout did not end it")
	}
	took := time.Since(killed)
	e, _ := w.err.Load().(error)
	if !errors.Is(e, unix.EIO) {
		t.Fatalf("writer error %v, want EIO", e)
	}
	// The timeout is in effect: the error came after the 2 s wait, not at once.
	if took < dead-200*time.Millisecond {
		t.Fatalf("I/O failed %v after the server died, before the %v dead-connection timeout", took, dead)
	}
	t.Logf("writer got %v %v after the server died (dead-connection timeout %v)", e, took.Round(time.Millisecond), dead)
	release(t, devs, idx)
}
