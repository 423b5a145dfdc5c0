package rootfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// escapeTree builds <tmp>/outside/secret (must never be reached) and a
// root whose decoys at the same names say "inside", plus symlinks that
// point outside in every way a guest could write them.
func escapeTree(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "outside"), filepath.Join(root, "etc"), filepath.Join(root, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(outside, "secret"), "OUTSIDE")
	write(filepath.Join(root, "outside", "secret"), "inside")
	write(filepath.Join(root, "etc", "hostname"), "inside")
	link := func(target, name string) {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	link(filepath.Join(outside, "secret"), "abs-secret")  // absolute, to the host path
	link("../../outside/secret", "dir/rel-secret")        // relative, climbing out
	link("/etc", "etc-link")                              // absolute dir link
	link("../../../../..", "dir/up")                      // relative dir link to "above" root
	link("/proc/self/root/etc/hostname", "magic")         // through a magic link
	link(filepath.Join(outside, "newfile"), "abs-create") // create through a link
	return root, outside
}

func TestOpenInRootStaysInside(t *testing.T) {
	root, outside := escapeTree(t)
	for _, c := range []struct {
		path string
		want string // content read, "" = must fail with not-exist
	}{
		{"outside/secret", "inside"},
		{"/outside/secret", "inside"},
		{"../outside/secret", "inside"},
		{"../../../../outside/secret", "inside"},
		{"dir/../../outside/secret", "inside"},
		{"dir/rel-secret", "inside"},
		{"dir/up/outside/secret", "inside"},
		{"etc-link/hostname", "inside"},
		{"/etc/hostname", "inside"},
		// The host path inside the root does not exist: no escape, ENOENT.
		{"abs-secret", ""},
	} {
		f, err := OpenInRoot(root, c.path, os.O_RDONLY, 0)
		if c.want == "" {
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("OpenInRoot(%q) = %v, want not-exist", c.path, err)
			}
			if f != nil {
				f.Close()
			}
			continue
		}
		if err != nil {
			t.Errorf("OpenInRoot(%q): %v", c.path, err)
			continue
		}
		b, err := io.ReadAll(f)
		f.Close()
		if err != nil || string(b) != c.want {
			t.Errorf("OpenInRoot(%q) read %q, %v; want %q", c.path, b, err, c.want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "OUTSIDE" {
		t.Fatalf("outside secret changed: %q", b)
	}
}

// A magic link can jump anywhere, even from a root that has a procfs in
// it (root "/" has one here); it must be refused with ELOOP.
func TestOpenInRootRefusesMagicLinks(t *testing.T) {
	root, _ := escapeTree(t)
	if f, err := OpenInRoot(root, "magic", os.O_RDONLY, 0); err == nil {
		f.Close()
		t.Fatal("OpenInRoot followed a link to /proc/self/root out of the root")
	}
	own, err := os.Open(filepath.Join(root, "etc", "hostname"))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	f, err := OpenInRoot("/", fmt.Sprintf("/proc/self/fd/%d", own.Fd()), os.O_RDONLY, 0)
	if err == nil {
		f.Close()
		t.Fatal("OpenInRoot followed /proc/self/fd magic link")
	}
	if !errors.Is(err, unix.ELOOP) {
		t.Errorf("magic link error = %v, want ELOOP", err)
	}
}

func TestOpenInRootCreate(t *testing.T) {
	root, outside := escapeTree(t)
	// Creating through an absolute symlink resolves it inside the root,
	// where its target's dir does not exist.
	_, err := OpenInRoot(root, "abs-create", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("create through outside link = %v, want not-exist", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "newfile")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("file created outside the root: %v", err)
	}
	// Parent dirs are never created.
	_, err = OpenInRoot(root, "/no/such/dir/file", os.O_WRONLY|os.O_CREATE, 0o644)
	if !errors.Is(err, ErrParentMissing) {
		t.Errorf("create in missing dir = %v, want ErrParentMissing", err)
	}
	if _, err := os.Stat(filepath.Join(root, "no")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("parent dir was created: %v", err)
	}
	// A plain create with ".." lands inside, with the asked mode.
	f, err := OpenInRoot(root, "../../dir/new.txt", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fi, err := os.Stat(filepath.Join(root, "dir", "new.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&^0o600 != 0 {
		t.Errorf("mode = %v, want at most 0600", fi.Mode().Perm())
	}
	// Missing file without O_CREATE is plain not-exist, not "parent missing".
	_, err = OpenInRoot(root, "dir/absent", os.O_RDONLY, 0)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrParentMissing) {
		t.Errorf("open absent = %v, want not-exist without ErrParentMissing", err)
	}
	// A bad root is an error, not a panic or an open of "/".
	if _, err := OpenInRoot(filepath.Join(root, "nope"), "etc/hostname", os.O_RDONLY, 0); err == nil {
		t.Error("OpenInRoot with a missing root succeeded")
	}
}
