package nbdsrv_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/testutil"
	"golang.org/x/sys/unix"
)

// failingBackend fails reads at or past failFrom, and every sync.
type failingBackend struct {
	nbdsrv.Backend
	failFrom int64
}

func (f failingBackend) ReadAt(p []byte, off int64) (int, error) {
	if off >= f.failFrom {
		return 0, fmt.Errorf("fetch chunk at %d: %w", off, unix.EIO)
	}
	return f.Backend.ReadAt(p, off)
}

func (f failingBackend) Sync() error { return fmt.Errorf("fdatasync dirty file: %w", unix.EIO) }

// TestErrorsCounted: each request the backend fails is counted by its
// command, each refused one as refused, and a connection that breaks
// the protocol as a connection error; good requests count nothing.
func TestErrorsCounted(t *testing.T) {
	const size = 1 << 20
	exp, _ := fileExport(t, size, false)
	exp.Backend = failingBackend{Backend: exp.Backend, failFrom: size / 2}
	srv, err := nbdsrv.New(exp, nbdsrv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testutil.SocketDir(t), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })

	r := connect(t, sock)
	r.read(1, 0, 4096) // fine: nothing counted
	r.send(0, cmdWrite, 2, 0, 512, make([]byte, 512))
	r.mustReply(2, 0)
	if got := srv.Errors(); got != (nbdsrv.Errors{}) {
		t.Fatalf("errors after good requests: %+v", got)
	}
	r.send(0, cmdRead, 3, size/2, 4096, nil)
	r.mustReply(3, 5) // EIO
	r.send(0, cmdRead, 4, size-4096, 4096, nil)
	r.mustReply(4, 5)
	r.send(0, cmdFlush, 5, 0, 0, nil)
	r.mustReply(5, 5)
	r.send(0, cmdRead, 6, size, 512, nil) // past the end: refused
	r.mustReply(6, eInval)
	r.read(7, 0, 512) // the connection still serves
	want := nbdsrv.Errors{Read: 2, Flush: 1, Refused: 1}
	if got := srv.Errors(); got != want {
		t.Fatalf("errors: %+v, want %+v", got, want)
	}
	// A request with a bad magic ends the connection: a connection error.
	r.write(make([]byte, 28))
	r.mustClose()
	want.Connection = 1
	deadline := time.Now().Add(10 * time.Second)
	for srv.Errors() != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := srv.Errors(); got != want {
		t.Fatalf("errors after a protocol violation: %+v, want %+v", got, want)
	}
	if k := want.ByKind(); k["read"] != 2 || k["flush"] != 1 || k["refused"] != 1 || k["connection"] != 1 || len(k) != 8 {
		t.Fatalf("ByKind: %v", k)
	}
}
