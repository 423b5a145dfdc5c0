// Package rootfstest is the contract of overlay.RootFS, the node's view of
// the overlay roots and their disk leases: one suite run against the fake
// kernel's (internal/node/fakekernel) on the host and against
// *rootfs.Overlay over a real overlayfs and an XFS with project quotas in
// the test VM (internal/rootfs), the way containerd's snapshots testsuite
// runs every snapshotter.
package rootfstest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node/overlay"
)

// Subject is one implementation under test: its scratch filesystem
// enforces disk leases (DiskBounded is nil).
type Subject struct {
	RootFS overlay.RootFS
	// Project is a disk project id of the case's own, ProjectTo the end
	// of a range around it that no other case uses.
	Project, ProjectTo uint32
}

// New makes a fresh subject for one case.
type New func(t *testing.T) Subject

// Run runs every case against the subjects newSubject makes. The cases
// unmount and unlimit what they made (t.Cleanup), so a leak check after
// each finds nothing.
func Run(t *testing.T, newSubject New) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSubject(t)
			c.run(t, t.Context(), s, template(t))
		})
	}
}

// template is a template dir: a file at the top, one in a subdir. Not
// t.TempDir: a case's name may hold a comma, which overlayfs options
// cannot carry.
func template(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rootfstest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for p, s := range map[string]string{"hello": "template", "sub/keep": "keep"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// mount mounts id over lower and unmounts it when the case ends.
func mount(t *testing.T, ctx context.Context, fs overlay.RootFS, id, lower string) string {
	t.Helper()
	t.Cleanup(func() {
		if err := fs.Unmount(context.Background(), id); err != nil {
			t.Errorf("cleanup: unmount %s: %v", id, err)
		}
	})
	root, err := fs.Mount(ctx, id, lower)
	if err != nil {
		t.Fatalf("mount %s: %v", id, err)
	}
	return root
}

// limit limits id's scratch dir to project and clears both when the case
// ends.
func limit(t *testing.T, ctx context.Context, fs overlay.RootFS, id string, project uint32, bytes int64) error {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		if err := fs.Unmount(ctx, id); err != nil {
			t.Errorf("cleanup: unmount %s: %v", id, err)
		}
		if err := fs.UnlimitDisk(ctx, project); err != nil {
			t.Errorf("cleanup: unlimit project %d: %v", project, err)
		}
	})
	return fs.LimitDisk(ctx, id, project, bytes)
}

func has(t *testing.T, what string, list func(context.Context) ([]string, error), id string) bool {
	t.Helper()
	ids, err := list(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return slices.Contains(ids, id)
}

var cases = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, s Subject, lower string)
}{
	{"a mount is idempotent, shows the template and is not gone", func(t *testing.T, ctx context.Context, s Subject, lower string) {
		fs := s.RootFS
		root := mount(t, ctx, fs, "rt-mount", lower)
		if again, err := fs.Mount(ctx, "rt-mount", lower); err != nil || again != root {
			t.Errorf("second mount = %q, %v; want %q, nil", again, err, root)
		}
		if fi, err := os.Stat(filepath.Join(root, "sub")); err != nil || !fi.IsDir() {
			t.Errorf("the template's dir in the root: %v", err)
		}
		if !has(t, "list", fs.List, "rt-mount") || !has(t, "mounted", fs.Mounted, "rt-mount") {
			t.Error("a mounted root is not listed and mounted")
		}
		dev, err := fs.Superblock("rt-mount")
		if err != nil || dev == "" {
			t.Fatalf("superblock = %q, %v; want a device", dev, err)
		}
		if ok, detail := fs.CheckGone(ctx, "rt-mount", dev); ok {
			t.Errorf("check gone of a mounted root: ok (%s)", detail)
		}
	}},
	{"a mount over another template conflicts and keeps the first", func(t *testing.T, ctx context.Context, s Subject, lower string) {
		fs := s.RootFS
		root := mount(t, ctx, s.RootFS, "rt-other", lower)
		if _, err := fs.Mount(ctx, "rt-other", template(t)); errdefs.CodeOf(err) != errdefs.CodeConflict {
			t.Errorf("mount over another template: %v, want conflict", err)
		}
		if again, err := fs.Mount(ctx, "rt-other", lower); err != nil || again != root {
			t.Errorf("the first mount after the conflict = %q, %v; want %q", again, err, root)
		}
	}},
	{"unmount is idempotent and proven gone", func(t *testing.T, ctx context.Context, s Subject, lower string) {
		fs := s.RootFS
		mount(t, ctx, fs, "rt-rm", lower)
		dev, err := fs.Superblock("rt-rm")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := fs.Unmount(ctx, "rt-rm"); err != nil {
				t.Fatalf("unmount %d: %v", i+1, err)
			}
		}
		if ok, detail := fs.CheckGone(ctx, "rt-rm", dev); !ok {
			t.Errorf("check gone after unmount: %s", detail)
		}
		if has(t, "list", fs.List, "rt-rm") || has(t, "mounted", fs.Mounted, "rt-rm") {
			t.Error("an unmounted root is listed or mounted")
		}
		if _, err := fs.Superblock("rt-rm"); err == nil {
			t.Error("superblock of an unmounted root: nil error")
		}
	}},
	{"an invalid id, a template that is no dir or that overlayfs cannot name is refused and makes nothing", func(t *testing.T, ctx context.Context, s Subject, lower string) {
		fs := s.RootFS
		for _, id := range []string{"../x", "", "a/b"} {
			if _, err := fs.Mount(ctx, id, lower); err == nil {
				t.Errorf("mount %q: nil, want an error", id)
			}
			if err := fs.Unmount(ctx, id); err == nil {
				t.Errorf("unmount %q: nil, want an error", id)
			}
			if ok, _ := fs.CheckGone(ctx, id, ""); ok {
				t.Errorf("check gone %q: ok, want not proven", id)
			}
		}
		comma := filepath.Join(lower, "a,b")
		if err := os.Mkdir(comma, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Mount(ctx, "rt-comma", comma); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("mount over a template path with a comma: %v, want invalid_argument", err)
		}
		file := filepath.Join(lower, "hello")
		if _, err := fs.Mount(ctx, "rt-file", file); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("mount over a file: %v, want invalid_argument", err)
		}
		if has(t, "list", fs.List, "rt-file") {
			t.Error("a refused mount left a scratch dir")
		}
		if has(t, "list", fs.List, "rt-comma") {
			t.Error("a refused mount left a scratch dir")
		}
	}},
	{"a disk limit makes the scratch dir and its project, both removed and proven", func(t *testing.T, ctx context.Context, s Subject, lower string) {
		fs := s.RootFS
		if err := fs.DiskBounded(); err != nil {
			t.Fatalf("disk bounded: %v", err)
		}
		for i := range 2 {
			if err := limit(t, ctx, fs, "rt-disk", s.Project, 1<<20); err != nil {
				t.Fatalf("limit %d: %v", i+1, err)
			}
		}
		qs, err := fs.DiskProjects(ctx, s.Project, s.ProjectTo)
		if err != nil || len(qs) != 1 || qs[0].ID != s.Project || qs[0].LimitBytes != 1<<20 {
			t.Errorf("disk projects = %+v, %v; want project %d limited to 1 MiB", qs, err, s.Project)
		}
		if ok, detail := fs.CheckDiskGone(ctx, s.Project); ok {
			t.Errorf("check disk gone of a limited project: ok (%s)", detail)
		}
		if !has(t, "list", fs.List, "rt-disk") || has(t, "mounted", fs.Mounted, "rt-disk") {
			t.Error("a limited scratch dir is not listed, or is mounted")
		}
		if err := fs.RemoveScratch("rt-disk"); err != nil {
			t.Fatalf("remove scratch: %v", err)
		}
		for i := range 2 {
			if err := fs.UnlimitDisk(ctx, s.Project); err != nil {
				t.Fatalf("unlimit %d: %v", i+1, err)
			}
		}
		if ok, detail := fs.CheckDiskGone(ctx, s.Project); !ok {
			t.Errorf("check disk gone after unlimit: %s", detail)
		}
		if qs, err := fs.DiskProjects(ctx, s.Project, s.ProjectTo); err != nil || len(qs) != 0 {
			t.Errorf("disk projects after unlimit = %+v, %v; want none", qs, err)
		}
	}},
	{"a project another dir holds conflicts; a limit without project or bytes is invalid", func(t *testing.T, ctx context.Context, s Subject, lower string) {
		fs := s.RootFS
		if err := limit(t, ctx, fs, "rt-p1", s.Project, 1<<20); err != nil {
			t.Fatal(err)
		}
		// rt-p2's dir goes before rt-p1's cleanup unlimits the project.
		t.Cleanup(func() {
			if err := fs.Unmount(context.Background(), "rt-p2"); err != nil {
				t.Errorf("cleanup: unmount rt-p2: %v", err)
			}
		})
		if err := fs.LimitDisk(ctx, "rt-p2", s.Project, 1<<20); errdefs.CodeOf(err) != errdefs.CodeConflict {
			t.Errorf("limit of another dir to a held project: %v, want conflict", err)
		}
		if err := fs.LimitDisk(ctx, "rt-p3", 0, 1<<20); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("limit to project 0: %v, want invalid_argument", err)
		}
		if err := fs.LimitDisk(ctx, "rt-p3", s.Project+1, 0); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("limit to 0 bytes: %v, want invalid_argument", err)
		}
	}},
}
