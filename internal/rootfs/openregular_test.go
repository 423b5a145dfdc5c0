package rootfs

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// withTimeout runs f and fails the test if it does not return in time: a
// hang is the bug under test, so it must be a failure, not a stuck run.
func withTimeout[T any](t *testing.T, what string, f func() (T, error)) (T, error) {
	t.Helper()
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() { v, err := f(); ch <- res{v, err} }()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s hung for 5s", what)
		panic("unreachable")
	}
}

// specialTree is a root holding one file of each kind a guest or template
// could put where the file API expects a regular file.
func specialTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "regular"), []byte("old content"), 0o644))
	must(os.Mkdir(filepath.Join(root, "dir"), 0o755))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o666))
	must(os.Symlink("/fifo", filepath.Join(root, "link-to-fifo")))
	ln, err := net.Listen("unix", filepath.Join(root, "sock"))
	must(err)
	t.Cleanup(func() { ln.Close() })
	if os.Geteuid() == 0 {
		// /dev/zero's numbers: reading it would never end.
		must(unix.Mknod(filepath.Join(root, "chardev"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))))
	}
	return root
}

func TestOpenRegularInRootRefusesSpecialFiles(t *testing.T) {
	root := specialTree(t)
	special := map[string]string{"dir": "directory", "fifo": "FIFO", "link-to-fifo": "FIFO", "sock": "socket"}
	if os.Geteuid() == 0 {
		special["chardev"] = "character device"
	} else {
		t.Log("not root: no device node in the tree")
	}
	for name, kind := range special {
		for _, flag := range []int{os.O_RDONLY, os.O_WRONLY | os.O_CREATE | os.O_TRUNC} {
			f, err := withTimeout(t, "open "+name, func() (*os.File, error) {
				return OpenRegularInRoot(root, "/"+name, flag, 0o644)
			})
			if err == nil {
				f.Close()
				t.Fatalf("open %s (flag %#x) succeeded; want ErrNotRegular", name, flag)
			}
			if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), kind) {
				t.Fatalf("open %s (flag %#x): %v; want ErrNotRegular naming %q", name, flag, err, kind)
			}
		}
	}
	// Nothing was replaced or truncated.
	if fi, err := os.Lstat(filepath.Join(root, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("fifo changed: %v %v", fi, err)
	}
}

func TestOpenRegularInRootReadsWritesCreates(t *testing.T) {
	root := specialTree(t)
	f, err := OpenRegularInRoot(root, "/regular", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	f.Close()
	if err != nil || string(b) != "old content" {
		t.Fatalf("read regular: %q, %v", b, err)
	}
	// Writing truncates an existing file...
	f, err = OpenRegularInRoot(root, "/regular", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("new"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, _ := os.ReadFile(filepath.Join(root, "regular")); string(b) != "new" {
		t.Fatalf("after write: %q, want the file truncated and rewritten", b)
	}
	// ...and creates a missing one, with perm.
	f, err = OpenRegularInRoot(root, "/dir/made", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, err := os.Lstat(filepath.Join(root, "dir", "made")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640&^currentUmask() {
		t.Fatalf("created file: %v, %v", fi, err)
	}
	// A missing file without O_CREATE is not-exist, as before.
	if _, err := OpenRegularInRoot(root, "/nope", os.O_RDONLY, 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open missing: %v, want not-exist", err)
	}
	if _, err := OpenRegularInRoot(root, "/no-dir/x", os.O_WRONLY|os.O_CREATE, 0o644); !errors.Is(err, ErrParentMissing) {
		t.Fatalf("create in missing dir: %v, want ErrParentMissing", err)
	}
}

func currentUmask() os.FileMode {
	m := unix.Umask(0)
	unix.Umask(m)
	return os.FileMode(m)
}
