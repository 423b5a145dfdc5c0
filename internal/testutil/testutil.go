// Package testutil holds the small helpers that the tests of several
// packages share. Nothing here touches the kernel (that is ktest's): a
// locked buffer, a short temp dir for Unix sockets, the open files under
// a dir, a bounded poll of a proof check.
package testutil

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer is a bytes.Buffer that one goroutine may write while another
// reads it (a test polling a command's output, a log sink).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// SocketDir is a fresh temp dir with a short path, removed when the test
// ends: a Unix socket path must fit in 108 bytes (sun_path), and
// t.TempDir's path embeds the test's name.
func SocketDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ctldt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// MuteListener listens on the Unix socket path and accepts every
// connection, holding it open and never answering (a peer that hangs),
// until the test ends.
func MuteListener(t testing.TB, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
}

// OpenFilesUnder lists the files under dir this process has open (read
// from /proc/self/fd): what a failed constructor must not leave.
func OpenFilesUnder(t testing.TB, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, fd := range fds {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(p, dir+"/") {
			open = append(open, p)
		}
	}
	return open
}

// Eventually calls check every 100 ms until it holds or within has
// passed, and returns its last answer: for a proof check of something the
// kernel ends asynchronously (a namespace after its last reference, a
// guest's processes after their delete).
func Eventually(within time.Duration, check func() (ok bool, detail string)) (bool, string) {
	deadline := time.Now().Add(within)
	for {
		ok, detail := check()
		if ok || time.Now().After(deadline) {
			return ok, detail
		}
		time.Sleep(100 * time.Millisecond)
	}
}
