package template

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeBusybox writes a shell script that answers --list like busybox does.
func fakeBusybox(t *testing.T, applets ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "busybox")
	script := "#!/bin/sh\n[ \"$1\" = --list ] || exit 1\nprintf '%s\\n' " + strings.Join(applets, " ") + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// render prints a root as one line per object so a whole tree compares as text.
func render(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			tgt, _ := os.Readlink(p)
			out = append(out, rel+" -> "+tgt)
		case fi.IsDir():
			out = append(out, rel+"/ "+fi.Mode().String())
		default:
			out = append(out, rel+" "+fi.Mode().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBusyboxLayout(t *testing.T) {
	es, err := BusyboxLayout("/bin/busybox", []string{"sh", "busybox", "ls", "sh", "["})
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{}
	for _, e := range es {
		if e.Mode&fs.ModeSymlink != 0 {
			links[e.Path] = e.Target
		}
	}
	want := map[string]string{"bin/sh": "busybox", "bin/ls": "busybox", "bin/[": "busybox", "usr/bin": "../bin"}
	if len(links) != len(want) {
		t.Fatalf("links = %v, want %v", links, want)
	}
	for k, v := range want {
		if links[k] != v {
			t.Errorf("link %s = %q, want %q", k, links[k], v)
		}
	}
	for _, bad := range []string{"../evil", "a/b", "", "..", "x\x00y"} {
		if _, err := BusyboxLayout("/bin/busybox", []string{bad}); err == nil {
			t.Errorf("applet %q accepted", bad)
		}
	}
}

func TestBuildBusybox(t *testing.T) {
	bb := fakeBusybox(t, "sh", "ls", "echo", "busybox")
	dir := filepath.Join(t.TempDir(), "root")
	if err := BuildBusybox(dir, bb); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"bin/ drwxr-xr-x",
		"bin/busybox -rwxr-xr-x",
		"bin/echo -> busybox",
		"bin/ls -> busybox",
		"bin/sh -> busybox",
		"dev/ drwxr-xr-x",
		"etc/ drwxr-xr-x",
		"etc/group -rw-r--r--",
		"etc/hosts -rw-r--r--",
		"etc/passwd -rw-r--r--",
		"proc/ dr-xr-xr-x",
		"root/ drwx------",
		"sys/ dr-xr-xr-x",
		"tmp/ dtrwxrwxrwx",
		"usr/ drwxr-xr-x",
		"usr/bin -> ../bin",
	}
	got := render(t, dir)
	if !slices.Equal(got, want) {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	pw, err := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(pw), "root:x:0:0:") || !strings.Contains(string(pw), "\nnobody:x:65534:65534:") {
		t.Errorf("passwd = %q", pw)
	}

	// Idempotent: a second run over a complete root changes nothing, and
	// repairs what was damaged.
	binPath := filepath.Join(dir, "bin/busybox")
	before, _ := os.Stat(binPath)
	if err := os.Remove(filepath.Join(dir, "bin/ls")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("elsewhere", filepath.Join(dir, "bin/ls")); err != nil {
		t.Fatal(err)
	}
	if err := BuildBusybox(dir, bb); err != nil {
		t.Fatal(err)
	}
	if got := render(t, dir); !slices.Equal(got, want) {
		t.Fatalf("after rebuild:\n%s", strings.Join(got, "\n"))
	}
	after, _ := os.Stat(binPath)
	if !os.SameFile(before, after) {
		t.Error("unchanged busybox binary was rewritten")
	}
}

func TestBuildBusyboxBadBinary(t *testing.T) {
	if err := BuildBusybox(t.TempDir(), filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing busybox accepted")
	}
}

// TestBuildBusyboxReal uses the host's static busybox when it is installed,
// to check that the real applet list yields the applets sandboxes rely on.
func TestBuildBusyboxReal(t *testing.T) {
	const bb = "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Skipf("no %s (Debian busybox-static): %v", bb, err)
	}
	dir := t.TempDir()
	if err := BuildBusybox(dir, bb); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "echo", "cat", "ls", "sleep", "nc", "wget", "sed", "id", "mkdir", "rm", "true", "false", "head", "dd", "env", "hostname"} {
		if tgt, err := os.Readlink(filepath.Join(dir, "bin", a)); err != nil || tgt != "busybox" {
			t.Errorf("bin/%s: target %q, err %v", a, tgt, err)
		}
	}
}
