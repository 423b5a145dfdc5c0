package testutil

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
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
