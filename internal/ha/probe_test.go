package ha

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/testutil"
)

func TestListenUnixModeAndStaleSocket(t *testing.T) {
	path := filepath.Join(testutil.SocketDir(t), "run", "ctld-a.sock")
	ln, err := ListenUnix(path, 0o660, os.Getgid())
	if err != nil {
		t.Fatalf("ListenUnix: %v", err)
	}
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode = %v, want socket 0660", st.Mode())
	}
	// A live server keeps its socket.
	if _, err := ListenUnix(path, 0o660, -1); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("ListenUnix over a live socket = %v, want ErrSocketInUse", err)
	}
	if c, err := net.Dial("unix", path); err != nil {
		t.Fatalf("live socket no longer answers after refused takeover: %v", err)
	} else {
		c.Close()
	}
	// Closing leaves the file (a successor may own the path by then) ...
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("Close removed the socket file: %v", err)
	}
	// ... and the next listener replaces the stale one.
	ln2, err := ListenUnix(path, 0o600, -1)
	if err != nil {
		t.Fatalf("ListenUnix over a stale socket: %v", err)
	}
	defer ln2.Close()
	if st, _ := os.Lstat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("replaced socket mode = %v, want 0600", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("socket dir has %d entries, want 1 (temp socket left?)", len(ents))
	}
}

func TestListenUnixRefusesNonSocket(t *testing.T) {
	path := filepath.Join(testutil.SocketDir(t), "ctld.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(path, 0o660, -1); err == nil {
		t.Fatal("ListenUnix replaced a regular file")
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Fatalf("regular file changed: %q, %v", b, err)
	}
}

func TestServeProbeAndProbe(t *testing.T) {
	path := filepath.Join(testutil.SocketDir(t), "ctld-b.sock")
	ln, err := ListenUnix(path, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	want := Status{Slot: "b", Role: RolePrimary, Epoch: 7, Health: "ok", PID: 1234, Since: since}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeProbe(ctx, ln, func() Status { return want }, nil) }()

	for range 3 { // one status per connection, any number of connections
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		got, err := Probe(pctx, path)
		pcancel()
		if err != nil {
			t.Fatalf("Probe: %v", err)
		}
		if got != want {
			t.Fatalf("Probe = %+v, want %+v", got, want)
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("ServeProbe after cancel = %v, want nil", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ServeProbe did not return after cancel")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), time.Second)
	defer pcancel()
	if _, err := Probe(pctx, path); err == nil {
		t.Fatal("Probe succeeded after the server stopped")
	}
}

func TestProbeHonoursContext(t *testing.T) {
	// A server that accepts but never answers must not hang the prober.
	path := filepath.Join(testutil.SocketDir(t), "mute.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(3 * time.Second)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Probe(ctx, path); err == nil {
		t.Fatal("Probe of a mute server succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Probe took %v despite a 200ms deadline", d)
	}
}
