package kernel_test

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pojntfx/go-nbd/pkg/backend"
	"github.com/pojntfx/go-nbd/pkg/client"
	"github.com/pojntfx/go-nbd/pkg/server"
	"golang.org/x/sys/unix"
)

// nbdSysBlock is where the kernel publishes block device state.
const nbdSysBlock = "/sys/block"

// nbdServer is a go-nbd server on one end of a socketpair; the other end is
// handed to the kernel.
type nbdServer struct {
	client *net.UnixConn // the end the kernel gets
	srv    net.Conn
	done   chan error // result of server.Handle
}

// nbdServe serves b as export "default" over a fresh socketpair. Cleanup
// kills the server and waits for its goroutine.
func nbdServe(t *testing.T, b backend.Backend) *nbdServer {
	t.Helper()
	cli, srv, err := nbdSocketpair()
	if err != nil {
		t.Fatalf("create nbd socketpair: %v", err)
	}
	s := &nbdServer{client: cli, srv: srv, done: make(chan error, 1)}
	go func() {
		s.done <- server.Handle(srv, []*server.Export{{Name: "default", Backend: b}}, &server.Options{
			MinimumBlockSize:   512,
			PreferredBlockSize: 4096,
			MaximumBlockSize:   4096,
		})
	}()
	t.Cleanup(func() {
		s.kill()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Errorf("nbd server goroutine did not end 10s after its socket closed")
		}
		_ = cli.Close()
	})
	return s
}

// kill closes the server's socket as a crashed server process would.
func (s *nbdServer) kill() { _ = s.srv.Close() }

func nbdSocketpair() (*net.UnixConn, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("nbd-socketpair-%d", i))
		c, err := net.FileConn(f) // dups fd
		_ = f.Close()
		if err != nil {
			for _, c := range conns[:i] {
				_ = c.Close()
			}
			if i == 0 {
				_ = unix.Close(fds[1])
			}
			return nil, nil, fmt.Errorf("wrap socketpair fd: %w", err)
		}
		conns[i] = c
	}
	return conns[0].(*net.UnixConn), conns[1], nil
}

// nbdDevice is a /dev/nbdX connected to an nbdServer by go-nbd's client.
type nbdDevice struct {
	name string   // nbdX
	dev  *os.File // the fd the client configured the device through
	done chan error
	once sync.Once
	err  error
}

// nbdUsed holds the devices this test binary already connected. The kernel
// releases a disconnected device's configuration asynchronously ("shutting
// down sockets"); connecting it again before that answers EBUSY, so each
// test takes a device no earlier test used.
var nbdUsed sync.Map

// nbdFreeDevice returns the first nbd device without a connection.
func nbdFreeDevice(t *testing.T) string {
	t.Helper()
	ents, err := os.ReadDir(nbdSysBlock)
	if err != nil {
		t.Fatalf("list %s: %v", nbdSysBlock, err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "nbd") {
			names = append(names, e.Name())
		}
	}
	// Numeric order, so nbd0 is preferred over nbd10.
	nbdSortByIndex(names)
	for _, n := range names {
		if _, used := nbdUsed.Load(n); used {
			continue
		}
		if _, err := os.Stat(filepath.Join(nbdSysBlock, n, "pid")); os.IsNotExist(err) {
			nbdUsed.Store(n, true)
			return n
		}
	}
	t.Fatalf("no free nbd device among %v", names)
	return ""
}

func nbdSortByIndex(names []string) {
	idx := func(n string) int {
		i, err := strconv.Atoi(strings.TrimPrefix(n, "nbd"))
		if err != nil {
			return 1 << 30
		}
		return i
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(idx(a), idx(b)) })
}

// nbdConnect connects device name to s with go-nbd's client (which configures
// the device through the NBD ioctls and then blocks in NBD_DO_IT until the
// device is disconnected). It returns once the kernel reports a size.
// timeoutSec is the per-request timeout (NBD_SET_TIMEOUT), 0 for none.
// Cleanup disconnects and closes the device.
func nbdConnect(t *testing.T, name string, s *nbdServer, timeoutSec int) *nbdDevice {
	t.Helper()
	f, err := os.OpenFile("/dev/"+name, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open /dev/%s: %v", name, err)
	}
	d := &nbdDevice{name: name, dev: f, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		d.done <- client.Connect(s.client, f, &client.Options{
			ExportName:             "default",
			BlockSize:              4096,
			OnConnected:            func() { close(ready) },
			ReadyCheckPollInterval: 10 * time.Millisecond,
			Timeout:                timeoutSec,
		})
	}()
	t.Cleanup(func() {
		if err := d.disconnect(15 * time.Second); err != nil {
			t.Errorf("disconnect %s: %v", name, err)
		}
		// client.Connect dups the socket fd (conn.File()) and never closes
		// the dup; only its finalizer does. Run it so the fd leak check
		// sees the real state.
		runtime.GC()
	})
	select {
	case <-ready:
		return d
	case err := <-d.done:
		d.done <- err // disconnect reads it again
		t.Fatalf("connect %s: %v", name, err)
	case <-time.After(15 * time.Second):
		t.Fatalf("connect %s: no size in %s/%s/size after 15s", name, nbdSysBlock, name)
	}
	return nil
}

// disconnect asks the kernel to disconnect the device, waits for the client's
// NBD_DO_IT to return and closes the device fd. Calling it again returns the
// first result.
func (d *nbdDevice) disconnect(wait time.Duration) error {
	d.once.Do(func() {
		var errs []error
		// Disconnecting a device whose connection already died is fine:
		// the kernel answers success or EINVAL, both mean "no connection".
		if err := client.Disconnect(d.dev); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("ioctl disconnect: %w", err))
		}
		select {
		case err := <-d.done:
			// After a requested disconnect NBD_DO_IT returns 0; after a dead
			// connection it may return an error, which the caller tested.
			_ = err
		case <-time.After(wait):
			errs = append(errs, fmt.Errorf("NBD_DO_IT still running %s after disconnect", wait))
		}
		if err := d.dev.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close device: %w", err))
		}
		d.err = errors.Join(errs...)
	})
	return d.err
}

// nbdQuiescence lists why device name under sysBlock is not quiescent: a
// connection pid, a non-zero size, holders, or requests in flight. Empty
// means quiescent, the state the cleanup proof asks for.
func nbdQuiescence(sysBlock, name string) []string {
	dir := filepath.Join(sysBlock, name)
	var out []string
	if _, err := os.Stat(filepath.Join(dir, "pid")); err == nil {
		out = append(out, "pid file present")
	} else if !os.IsNotExist(err) {
		out = append(out, fmt.Sprintf("stat pid: %v", err))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "size")); err != nil {
		out = append(out, fmt.Sprintf("read size: %v", err))
	} else if s := strings.TrimSpace(string(b)); s != "0" {
		out = append(out, "size "+s)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "holders")); err != nil {
		out = append(out, fmt.Sprintf("read holders: %v", err))
	} else if len(ents) > 0 {
		var hs []string
		for _, e := range ents {
			hs = append(hs, e.Name())
		}
		out = append(out, "holders "+strings.Join(hs, ","))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "inflight")); err != nil {
		out = append(out, fmt.Sprintf("read inflight: %v", err))
	} else if f := strings.Fields(string(b)); len(f) != 2 || f[0] != "0" || f[1] != "0" {
		out = append(out, fmt.Sprintf("inflight %q", strings.TrimSpace(string(b))))
	}
	return out
}

// nbdWaitQuiescent polls nbdQuiescence until it is empty or wait passes.
func nbdWaitQuiescent(sysBlock, name string, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		q := nbdQuiescence(sysBlock, name)
		if len(q) == 0 || time.Now().After(deadline) {
			return q
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nbdStallBackend wraps a backend so that, once armed, the next read parks
// inside the server (as a hung server would) until released.
type nbdStallBackend struct {
	backend.Backend
	mu      sync.Mutex
	armed   bool
	stalled chan struct{} // closed when a read parked
	release chan struct{} // close to let the parked read go on
}

func nbdNewStallBackend(b backend.Backend) *nbdStallBackend {
	return &nbdStallBackend{Backend: b, stalled: make(chan struct{}), release: make(chan struct{})}
}

func (b *nbdStallBackend) arm() {
	b.mu.Lock()
	b.armed = true
	b.mu.Unlock()
}

func (b *nbdStallBackend) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	park := b.armed
	b.armed = false
	b.mu.Unlock()
	if park {
		close(b.stalled)
		<-b.release
	}
	return b.Backend.ReadAt(p, off)
}

// nbdAlignedBuf returns an n-byte page-aligned buffer for O_DIRECT, freed at
// cleanup.
func nbdAlignedBuf(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}
