package cowdev_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/ctld/ctld/internal/cowdev"
)

// TestDirtyBytes: DirtyBytes is the disk the generation's own writes take: nothing for
// reads of the base, whole chunks for writes (a partial write of a clean
// chunk copies the chunk in), a trimmed chunk's back to a hole.
func TestDirtyBytes(t *testing.T) {
	f := newFixture(t, 8)
	dir := t.TempDir()
	if _, err := cowdev.DirtyBytes(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no device yet: %v, want ErrNotExist", err)
	}
	d := open(t, f, tpl0, dir)
	got := func(when string, want uint64) {
		t.Helper()
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}
		n, err := cowdev.DirtyBytes(dir)
		if err != nil || n != want {
			t.Fatalf("%s: DirtyBytes %d, %v; want %d", when, n, err, want)
		}
	}
	got("opened", 0)
	readAll(t, d)
	got("after reading the whole base", 0)
	if _, err := d.WriteAt(make([]byte, cs), cs); err != nil { // chunk 1 whole
		t.Fatal(err)
	}
	if _, err := d.WriteAt([]byte("x"), 2*cs+5); err != nil { // one byte of chunk 2
		t.Fatal(err)
	}
	got("after writing two chunks", 2*cs)
	if err := d.Trim(cs, cs); err != nil {
		t.Fatal(err)
	}
	got("after trimming one", cs)
}
