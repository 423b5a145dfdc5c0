// Package template builds the root trees sandboxes start from.
//
// The busybox template is a directory: the overlay RootFS uses it as its
// lower layer and tests use it directly as an OCI root. BuildImage turns any
// tree (that directory, a tarball, an OCI image archive) into an ext4 image
// of a given size, without mounting, for block-mode RootFS.
package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Entry is one file system object of a template, described as data so the
// layout can be checked without touching a disk.
type Entry struct {
	Path    string      // relative to the root, slash-separated
	Mode    fs.FileMode // permission bits; fs.ModeDir / fs.ModeSymlink select the kind
	Target  string      // symlink target
	Content []byte      // regular file content (unused for the busybox binary)
	Source  string      // copy the regular file from this host path instead of Content
}

const (
	passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	group  = "root:x:0:\nnogroup:x:65534:\n"
	hosts  = "127.0.0.1\tlocalhost\n::1\tlocalhost\n"
)

// BusyboxLayout describes the busybox root: the static binary at
// /bin/busybox, one symlink in /bin per applet, the users and groups root and
// nobody, and the empty directories a runtime mounts over.
func BusyboxLayout(busyboxPath string, applets []string) ([]Entry, error) {
	es := []Entry{
		{Path: "bin", Mode: fs.ModeDir | 0o755},
		{Path: "dev", Mode: fs.ModeDir | 0o755},
		{Path: "etc", Mode: fs.ModeDir | 0o755},
		{Path: "proc", Mode: fs.ModeDir | 0o555},
		{Path: "root", Mode: fs.ModeDir | 0o700},
		{Path: "sys", Mode: fs.ModeDir | 0o555},
		{Path: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "usr", Mode: fs.ModeDir | 0o755},
		// Scripts often say /usr/bin/env; one link covers them all.
		{Path: "usr/bin", Mode: fs.ModeSymlink, Target: "../bin"},
		{Path: "bin/busybox", Mode: 0o755, Source: busyboxPath},
		{Path: "etc/passwd", Mode: 0o644, Content: []byte(passwd)},
		{Path: "etc/group", Mode: 0o644, Content: []byte(group)},
		{Path: "etc/hosts", Mode: 0o644, Content: []byte(hosts)},
	}
	seen := map[string]bool{}
	for _, a := range applets {
		if a == "busybox" || seen[a] {
			continue
		}
		if a == "" || a == "." || a == ".." || strings.ContainsAny(a, "/\x00") {
			return nil, fmt.Errorf("check applet name %q: not a plain file name", a)
		}
		seen[a] = true
		es = append(es, Entry{Path: "bin/" + a, Mode: fs.ModeSymlink, Target: "busybox"})
	}
	return es, nil
}

// Applets asks the busybox binary for the names of its applets.
func Applets(ctx context.Context, busyboxPath string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list applets of %s: %w", busyboxPath, err)
	}
	names := strings.Fields(string(out))
	if len(names) == 0 {
		return nil, fmt.Errorf("list applets of %s: empty list", busyboxPath)
	}
	slices.Sort(names)
	return names, nil
}

// BuildBusybox makes (or brings up to date) a busybox root in dir from the
// static busybox at busyboxPath. Running it again over a complete root
// changes nothing.
func BuildBusybox(dir, busyboxPath string) error {
	applets, err := Applets(context.Background(), busyboxPath)
	if err != nil {
		return err
	}
	layout, err := BusyboxLayout(busyboxPath, applets)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create template dir: %w", err)
	}
	return Apply(dir, layout)
}

// Apply makes every entry exist under root as described, in order. Entries
// that already match are left alone; a mismatching one is replaced.
func Apply(root string, es []Entry) error {
	for _, e := range es {
		if err := applyEntry(root, e); err != nil {
			return err
		}
	}
	return nil
}

func applyEntry(root string, e Entry) error {
	p := filepath.Join(root, filepath.FromSlash(e.Path))
	switch {
	case e.Mode&fs.ModeDir != 0:
		fi, err := os.Lstat(p)
		if err == nil && !fi.IsDir() {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("replace %s: %w", p, err)
			}
		}
		if err := os.Mkdir(p, e.Mode.Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create dir %s: %w", p, err)
		}
		// Chmod because Mkdir's mode passes through the umask and has no sticky bit.
		if err := os.Chmod(p, e.Mode.Perm()|e.Mode&fs.ModeSticky); err != nil {
			return fmt.Errorf("chmod dir %s: %w", p, err)
		}
		return nil
	case e.Mode&fs.ModeSymlink != 0:
		if t, err := os.Readlink(p); err == nil && t == e.Target {
			return nil
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("replace %s: %w", p, err)
		}
		if err := os.Symlink(e.Target, p); err != nil {
			return fmt.Errorf("create symlink %s: %w", p, err)
		}
		return nil
	default:
		content := e.Content
		if e.Source != "" {
			b, err := os.ReadFile(e.Source)
			if err != nil {
				return fmt.Errorf("read %s: %w", e.Source, err)
			}
			content = b
		}
		return writeFile(p, content, e.Mode.Perm())
	}
}

// writeFile replaces p with content through a temp file and rename, so a
// crash never leaves a half-written binary, and skips the write when p
// already holds content.
func writeFile(p string, content []byte, perm fs.FileMode) error {
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Size() == int64(len(content)) {
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, content) {
			if fi.Mode().Perm() == perm {
				return nil
			}
			if err := os.Chmod(p, perm); err != nil {
				return fmt.Errorf("chmod %s: %w", p, err)
			}
			return nil
		}
	}
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp*")
	if err != nil {
		return fmt.Errorf("create temp for %s: %w", p, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := io.Copy(f, bytes.NewReader(content)); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("replace %s: %w", p, err)
		}
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}
