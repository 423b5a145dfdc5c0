package testutil

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Writes from several goroutines while another reads all land (run with
// -race to see the lock matter).
func TestBufferConcurrentWriters(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := len(b.String()); got != 800 {
		t.Fatalf("buffer holds %d bytes, want 800", got)
	}
}

// SocketDir's path is short enough for a socket with room to spare (the
// ctld tests put sockets a dir or two below it), and it is gone after the
// test.
func TestSocketDir(t *testing.T) {
	var dir string
	t.Run("sub", func(t *testing.T) {
		dir = SocketDir(t)
		if len(dir) > 40 {
			t.Fatalf("SocketDir %s is %d bytes long", dir, len(dir))
		}
		l, err := net.Listen("unix", filepath.Join(dir, "s.sock"))
		if err != nil {
			t.Fatalf("listen in SocketDir: %v", err)
		}
		l.Close()
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("SocketDir %s is left after the test: %v", dir, err)
	}
	if !strings.HasPrefix(dir, os.TempDir()) {
		t.Fatalf("SocketDir %s is not under %s", dir, os.TempDir())
	}
}

// A MuteListener accepts and holds a connection without a byte of answer;
// the connection ends once the test that made it has.
func TestMuteListener(t *testing.T) {
	path := filepath.Join(SocketDir(t), "mute.sock")
	var c net.Conn
	t.Run("sub", func(t *testing.T) {
		MuteListener(t, path)
		var err error
		if c, err = net.Dial("unix", path); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("hello?")); err != nil {
			t.Fatalf("write to a mute peer: %v", err)
		}
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read from a mute peer: %d bytes, %v; want the deadline", n, err)
		}
	})
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// EOF, or a reset: the peer closed with the test's bytes unread.
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after the test ended: %v, want the connection closed", err)
	}
}

func TestOpenFilesUnder(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if got := OpenFilesUnder(t, dir); len(got) != 1 || got[0] != f.Name() {
		t.Fatalf("open under %s: %v, want [%s]", dir, got, f.Name())
	}
	f.Close()
	if got := OpenFilesUnder(t, dir); len(got) != 0 {
		t.Fatalf("open under %s after close: %v", dir, got)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	if ok, detail := Eventually(5*time.Second, func() (bool, string) { n++; return n == 3, fmt.Sprint(n) }); !ok || detail != "3" {
		t.Errorf("eventually = %v %q; want the third answer", ok, detail)
	}
	t0 := time.Now()
	if ok, detail := Eventually(300*time.Millisecond, func() (bool, string) { return false, "never" }); ok || detail != "never" {
		t.Errorf("eventually of a check that never holds = %v %q", ok, detail)
	}
	if d := time.Since(t0); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("gave up after %v, want about 300ms", d)
	}
}
