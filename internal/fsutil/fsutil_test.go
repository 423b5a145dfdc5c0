package fsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestWriteFileAtomicCreatesAndReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "epoch")
	if err := WriteFileAtomic(p, []byte("1\n"), 0o644); err != nil {
		t.Fatalf("first write: %v", err)
	}
	if err := WriteFileAtomic(p, []byte("2\n"), 0o644); err != nil {
		t.Fatalf("second write: %v", err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "2\n" {
		t.Fatalf("content = %q, want %q", got, "2\n")
	}
	assertOnlyFiles(t, dir, "epoch")
}

func TestWriteFileAtomicPermIgnoresUmask(t *testing.T) {
	dir := t.TempDir()
	for _, perm := range []os.FileMode{0o600, 0o644, 0o640} {
		p := filepath.Join(dir, "f"+perm.String())
		if err := WriteFileAtomic(p, []byte("x"), perm); err != nil {
			t.Fatalf("write %v: %v", perm, err)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != perm {
			t.Errorf("mode = %v, want %v", st.Mode().Perm(), perm)
		}
	}
}

func TestWriteFileAtomicReplacesInode(t *testing.T) {
	// A reader holding the old file keeps the old content: the new content
	// arrives by rename, never by writing in place.
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	if err := WriteFileAtomic(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteFileAtomic(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	n, _ := f.Read(buf)
	if string(buf[:n]) != "old" {
		t.Fatalf("open handle sees %q, want %q", buf[:n], "old")
	}
}

func TestWriteFileAtomicMissingDirFailsCleanly(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope", "file")
	err := WriteFileAtomic(p, []byte("x"), 0o644)
	if err == nil {
		t.Fatal("write into missing dir succeeded")
	}
	if !strings.Contains(err.Error(), "create temp file") {
		t.Fatalf("error %q does not say what failed", err)
	}
}

func TestWriteFileAtomicRenameFailureRemovesTemp(t *testing.T) {
	dir := t.TempDir()
	// A non-empty directory at the target makes the rename fail.
	p := filepath.Join(dir, "target")
	if err := os.MkdirAll(filepath.Join(p, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("x"), 0o644); err == nil {
		t.Fatal("rename over a non-empty directory succeeded")
	}
	assertOnlyFiles(t, dir, "target")
}

func assertOnlyFiles(t *testing.T, dir string, want ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("dir has %v, want %v (temp file left behind?)", got, want)
	}
}

func TestCreateFileOnceNeverReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "node.key")
	if err := CreateFileOnce(p, []byte("first"), 0o600); err != nil {
		t.Fatalf("create: %v", err)
	}
	err := CreateFileOnce(p, []byte("second"), 0o600)
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create error = %v, want fs.ErrExist", err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "first" {
		t.Fatalf("content = %q, want %q", got, "first")
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, want 0600", st.Mode().Perm())
	}
	assertOnlyFiles(t, dir, "node.key")
}

func TestCreateFileOnceRaceHasOneWinner(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "node-id")
	const n = 16
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- CreateFileOnce(p, []byte(strconv.Itoa(i)), 0o644)
		}()
	}
	wg.Wait()
	close(errs)
	wins := 0
	for err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, fs.ErrExist):
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d creators won, want exactly 1", wins)
	}
	assertOnlyFiles(t, dir, "node-id")
}
