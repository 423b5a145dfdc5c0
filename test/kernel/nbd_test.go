package kernel_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/pojntfx/go-nbd/pkg/backend"
	"github.com/pojntfx/go-nbd/pkg/client"
	"golang.org/x/sys/unix"
)

const nbdExportSize = 4 << 20

// nbdBackingFile creates a sparse export-sized file in a temp dir.
func nbdBackingFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "export.img"))
	if err != nil {
		t.Fatalf("create backing file: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if err := f.Truncate(nbdExportSize); err != nil {
		t.Fatalf("size backing file: %v", err)
	}
	return f
}

// nbdOpenDirect opens the block device bypassing the page cache, so every
// read and write is a request to the server.
func nbdOpenDirect(t *testing.T, name string) int {
	t.Helper()
	fd, err := unix.Open("/dev/"+name, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/%s O_DIRECT: %v", name, err)
	}
	return fd
}

func nbdPattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed ^ byte(i*31+i>>8)
	}
	return p
}

func TestNBDWriteReadDisconnect(t *testing.T) {
	ktest.RequireNBD(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})

	file := nbdBackingFile(t)
	srv := nbdServe(t, backend.NewFileBackend(file))
	name := nbdFreeDevice(t)
	dev := nbdConnect(t, name, srv, 0)

	// go-nbd reports "connected" at the first non-zero size; the kernel may
	// publish the final capacity a moment later, so allow it to settle.
	var size string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		sizeB, err := os.ReadFile(filepath.Join(nbdSysBlock, name, "size"))
		if err != nil {
			t.Fatalf("read size: %v", err)
		}
		if size = strings.TrimSpace(string(sizeB)); size == "8192" || time.Now().After(deadline) {
			break
		}
	}
	if size != "8192" {
		select {
		case err := <-srv.done:
			t.Fatalf("%s size = %s sectors, want 8192 (%d bytes); the server ended: %v", name, size, nbdExportSize, err)
		default:
			t.Fatalf("%s size = %s sectors, want 8192 (%d bytes); the server still runs", name, size, nbdExportSize)
		}
	}

	const off, n = 1 << 20, 64 << 10
	want := nbdPattern(n, 0x5a)
	buf := nbdAlignedBuf(t, n)
	fd := nbdOpenDirect(t, name)
	copy(buf, want)
	if w, err := unix.Pwrite(fd, buf, off); err != nil || w != n {
		_ = unix.Close(fd)
		t.Fatalf("pwrite /dev/%s: n=%d err=%v", name, w, err)
	}
	if err := unix.Fsync(fd); err != nil {
		_ = unix.Close(fd)
		t.Fatalf("fsync /dev/%s: %v", name, err)
	}
	clear(buf)
	if r, err := unix.Pread(fd, buf, off); err != nil || r != n {
		_ = unix.Close(fd)
		t.Fatalf("pread /dev/%s: n=%d err=%v", name, r, err)
	}
	if err := unix.Close(fd); err != nil {
		t.Fatalf("close /dev/%s: %v", name, err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatalf("read back through /dev/%s differs from what was written", name)
	}
	got := make([]byte, n)
	if _, err := file.ReadAt(got, off); err != nil {
		t.Fatalf("read backing file: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("backing file at %d differs from what was written through /dev/%s", off, name)
	}

	if err := dev.disconnect(15 * time.Second); err != nil {
		t.Fatalf("disconnect %s: %v", name, err)
	}
	if q := nbdWaitQuiescent(nbdSysBlock, name, 5*time.Second); len(q) > 0 {
		t.Fatalf("%s not quiescent after disconnect: %s", name, strings.Join(q, "; "))
	}
}

type nbdReadResult struct {
	n   int
	err error
}

// nbdReadOnDeadServer connects a device with the given per-request timeout,
// parks an O_DIRECT read inside the server and then kills the server. It
// returns the device, the device fd the read runs on (close it only after
// the read returned) and the read's result channel.
func nbdReadOnDeadServer(t *testing.T, timeoutSec int) (*nbdDevice, int, <-chan nbdReadResult) {
	t.Helper()
	file := nbdBackingFile(t)
	stall := nbdNewStallBackend(backend.NewFileBackend(file))
	srv := nbdServe(t, stall)
	dev := nbdConnect(t, nbdFreeDevice(t), srv, timeoutSec)

	const n = 4096
	buf := nbdAlignedBuf(t, n)
	fd := nbdOpenDirect(t, dev.name)
	if r, err := unix.Pread(fd, buf, 0); err != nil || r != n {
		_ = unix.Close(fd)
		t.Fatalf("pread before kill: n=%d err=%v", r, err)
	}
	res := make(chan nbdReadResult, 1)
	stall.arm()
	go func() {
		r, err := unix.Pread(fd, buf, 2<<20)
		res <- nbdReadResult{r, err}
	}()
	select {
	case <-stall.stalled:
	case <-time.After(10 * time.Second):
		close(stall.release)
		t.Fatalf("read at 2 MiB never reached the server")
	}
	srv.kill()
	close(stall.release)
	return dev, fd, res
}

// nbdFinishDead checks the dead-server read failed with EIO, then closes the
// fd, disconnects and checks the device is quiescent.
func nbdFinishDead(t *testing.T, dev *nbdDevice, fd int, r nbdReadResult) {
	t.Helper()
	if r.err == nil {
		t.Errorf("read on a dead server returned %d bytes and no error", r.n)
	} else if !errors.Is(r.err, unix.EIO) {
		t.Errorf("read on a dead server: err %v, want EIO", r.err)
	}
	if err := unix.Close(fd); err != nil {
		t.Errorf("close /dev/%s: %v", dev.name, err)
	}
	if err := dev.disconnect(15 * time.Second); err != nil {
		t.Fatalf("disconnect %s: %v", dev.name, err)
	}
	if q := nbdWaitQuiescent(nbdSysBlock, dev.name, 5*time.Second); len(q) > 0 {
		t.Fatalf("%s not quiescent after its server died: %s", dev.name, strings.Join(q, "; "))
	}
}

// TestNBDDeadServerFailsIO kills the server while a read is parked inside it
// and proves the read fails with EIO within a bound instead of hanging. The
// bound comes from the per-request timeout (NBD_SET_TIMEOUT, go-nbd's
// Options.Timeout); TestNBDDeadServerNoTimeoutHangs is the control.
func TestNBDDeadServerFailsIO(t *testing.T) {
	ktest.RequireNBD(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})

	const timeoutSec, bound = 2, 10 * time.Second
	dev, fd, res := nbdReadOnDeadServer(t, timeoutSec)
	start := time.Now()
	select {
	case r := <-res:
		t.Logf("read on a dead server returned after %s: n=%d err=%v", time.Since(start).Round(time.Millisecond), r.n, r.err)
		nbdFinishDead(t, dev, fd, r)
	case <-time.After(bound):
		t.Errorf("read on a dead server still blocked after %s (timeout %ds)", bound, timeoutSec)
		// Disconnect clears the queue, which ends the read.
		_ = dev.disconnect(15 * time.Second)
		select {
		case <-res:
			_ = unix.Close(fd)
		case <-time.After(bound):
			t.Fatalf("read still blocked after disconnect; leaving fd %d open", fd)
		}
	}
}

// TestNBDDeadServerNoTimeoutHangs is the control for TestNBDDeadServerFailsIO:
// without a per-request timeout an ioctl-configured device keeps the request
// of a dead server queued (the kernel re-arms its timer) until someone
// disconnects the device. This is why ctld needs a dead-connection policy.
func TestNBDDeadServerNoTimeoutHangs(t *testing.T) {
	ktest.RequireNBD(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})

	const hang, bound = 4 * time.Second, 10 * time.Second
	dev, fd, res := nbdReadOnDeadServer(t, 0)
	select {
	case r := <-res:
		_ = unix.Close(fd)
		t.Fatalf("read on a dead server without timeout returned (n=%d err=%v); expected it to stay queued", r.n, r.err)
	case <-time.After(hang):
	}
	if err := client.Disconnect(dev.dev); err != nil {
		t.Logf("disconnect ioctls on a dead connection: %v", err)
	}
	select {
	case r := <-res:
		nbdFinishDead(t, dev, fd, r)
	case <-time.After(bound):
		t.Fatalf("read still blocked %s after disconnect; leaving fd %d open", bound, fd)
	}
}

func TestNBDQuiescenceFakeSysfs(t *testing.T) {
	write := func(t *testing.T, dir, name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dev string)
		want  []string
	}{
		{"quiescent", func(t *testing.T, dev string) {}, nil},
		{"connected", func(t *testing.T, dev string) {
			write(t, dev, "pid", "42\n")
			write(t, dev, "size", "8192\n")
			write(t, dev, "inflight", "       0        1\n")
			if err := os.Mkdir(filepath.Join(dev, "holders", "dm-0"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, []string{"pid file present", "size 8192", "holders dm-0", `inflight "0        1"`}},
		{"no size file", func(t *testing.T, dev string) {
			if err := os.Remove(filepath.Join(dev, "size")); err != nil {
				t.Fatal(err)
			}
		}, []string{"read size: open " + "SYS/nbd3/size: no such file or directory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sys := t.TempDir()
			dev := filepath.Join(sys, "nbd3")
			if err := os.MkdirAll(filepath.Join(dev, "holders"), 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, dev, "size", "0\n")
			write(t, dev, "inflight", "       0        0\n")
			tc.setup(t, dev)
			got := nbdQuiescence(sys, "nbd3")
			for i := range got {
				got[i] = strings.ReplaceAll(got[i], sys, "SYS")
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("nbdQuiescence = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNBDSortByIndex(t *testing.T) {
	names := []string{"nbd10", "nbd2", "nbd0", "nbd1"}
	nbdSortByIndex(names)
	if got, want := strings.Join(names, ","), "nbd0,nbd1,nbd2,nbd10"; got != want {
		t.Errorf("sorted = %s, want %s", got, want)
	}
}
