//go:build recipes

package recipe

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// TestBuildRealPython builds the shipped python recipe with the real
// mmdebstrap from the Debian mirror (minutes:
// `make test-recipes`, which the unit stage does not run; root): the tree has python3, the host's package state is the same
// before and after (dpkg -l), and a second build is a cache hit.
func TestBuildRealPython(t *testing.T) {
	needRootAndMkfs(t)
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Fatal("needs mmdebstrap (test/recipe/setup.sh installs it)")
	}
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "templates", "python.toml"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	dpkg := func() string {
		out, err := exec.Command("dpkg", "-l").Output()
		if err != nil {
			t.Fatalf("dpkg -l: %v", err)
		}
		return string(out)
	}
	before := dpkg()
	st, repo := templatetest.Repo(t)
	b := Builder{CacheDir: filepath.Join(t.TempDir(), "cache"), Output: testWriter{t}}
	ctx := context.Background()
	out, err := Build(ctx, st, repo, b, "python", r, 1<<30, t.TempDir(), nil)
	if err != nil || out.TreeCached {
		t.Fatalf("build = %+v, %v", out, err)
	}
	root := filepath.Join(b.CacheDir, r.TreeDigest(), "root")
	if fi, err := os.Stat(filepath.Join(root, "usr", "bin", "python3")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("python3 in the tree: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc", "ctl-template")); err != nil || string(b) != "python\n" {
		t.Fatalf("/etc/ctl-template = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc", "passwd")); err != nil || !strings.Contains(string(b), "user:x:1000:1000") {
		t.Fatalf("the recipe's command did not run: /etc/passwd %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "ctl-recipe.sh")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the commands' script is left in the tree: %v", err)
	}
	if after := dpkg(); after != before {
		t.Fatalf("the host's packages changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if err := template.Remove(ctx, st, repo, "python"); err != nil {
		t.Fatal(err)
	}
	if out, err := Build(ctx, st, repo, b, "python", r, 1<<30, t.TempDir(), nil); err != nil || !out.TreeCached {
		t.Fatalf("second build = %+v, %v: want a cache hit", out, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
