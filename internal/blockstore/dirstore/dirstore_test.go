package dirstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) blockstore.Store {
		s, err := Open(filepath.Join(t.TempDir(), "store"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestOpenRefusesRelativeRoot(t *testing.T) {
	if _, err := Open("relative/dir"); err == nil {
		t.Fatal("Open of a relative root succeeded")
	}
}

// A crashed Put leaves a temp file: List never shows it, Sweep removes it
// once it is old, and a young one (a Put in flight) is left alone.
func TestSweepAndTempFilesHidden(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "sb/chunks/aa", []byte("x")); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(s.Root(), "sb", "chunks", ".bb.tmp-123")
	young := filepath.Join(s.Root(), "sb", "chunks", ".cc.tmp-456")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	keys, err := s.List(ctx, "")
	if err != nil || len(keys) != 1 || keys[0] != "sb/chunks/aa" {
		t.Fatalf("List = %q, %v; want only the object", keys, err)
	}
	n, err := s.Sweep(ctx, 10*time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want 1 removed", n, err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("old temp file still there: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Fatalf("young temp file removed: %v", err)
	}
}

// Objects are files of mode 0600 in directories of 0700.
func TestModes(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), "a/b/c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"": 0o700, "a": 0o700, "a/b": 0o700, "a/b/c": 0o600} {
		fi, err := os.Stat(filepath.Join(s.Root(), p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%q mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
}

// TestGetBuffer: GetBuffer answers as Get does: the object's bytes (in buf's storage
// when it fits), ErrNotFound for a missing key, a key under an object and
// a key that is a directory of other keys.
func TestGetBuffer(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("object "), 1000)
	if err := s.Put(ctx, "v/chunks/aa/obj", data); err != nil {
		t.Fatal(err)
	}
	small := make([]byte, 0, 10)
	got, err := s.GetBuffer(ctx, "v/chunks/aa/obj", small)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("GetBuffer into a small buffer = %d bytes, %v", len(got), err)
	}
	big := make([]byte, 0, 2*len(data))
	got, err = s.GetBuffer(ctx, "v/chunks/aa/obj", big)
	if err != nil || !bytes.Equal(got, data) || &got[0] != &big[:1][0] {
		t.Fatalf("GetBuffer into a large buffer = %d bytes, %v (own storage: %v)", len(got), err, err == nil && &got[0] == &big[:1][0])
	}
	for _, key := range []string{"v/chunks/aa/missing", "v/chunks/aa/obj/under", "v/chunks/aa", "v/chunks"} {
		if _, err := s.GetBuffer(ctx, key, big); !errors.Is(err, blockstore.ErrNotFound) {
			t.Errorf("GetBuffer(%s) = %v, want ErrNotFound", key, err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, blockstore.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want ErrNotFound", key, err)
		}
	}
}

// TestGetBounded (issue 21): an object file larger than its key's kind
// allows (a tampered store) is ErrTooLarge from Get and GetBuffer, and
// nothing of it is read.
func TestGetBounded(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := "sandboxes/sb/head/00000000000000000001"
	if err := s.Put(ctx, key, []byte("small")); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Get(ctx, key); err != nil || string(b) != "small" {
		t.Fatalf("get of a small head: %q, %v", b, err)
	}
	if err := os.Truncate(filepath.Join(s.Root(), key), blockstore.MaxSmallObject+1); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Get(ctx, key); !errors.Is(err, blockstore.ErrTooLarge) || b != nil {
		t.Fatalf("get of an oversized head: %d bytes, %v; want ErrTooLarge", len(b), err)
	}
	if b, err := s.GetBuffer(ctx, key, nil); !errors.Is(err, blockstore.ErrTooLarge) || b != nil {
		t.Fatalf("GetBuffer of an oversized head: %d bytes, %v; want ErrTooLarge", len(b), err)
	}
}
