package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ctld/ctld/client"
)

// fakeMmdebstrap stands for mmdebstrap on the PATH: it counts its runs in
// $FAKE_RUNS and makes the target directory with one file.
const fakeMmdebstrap = `#!/bin/sh
echo run >> "$FAKE_RUNS"
eval out=\${$(($# - 1))}
mkdir -p "$out/etc"
echo fake > "$out/etc/os-release"
`

// TestCLITemplateBuild: template build makes a template from a recipe
// (mmdebstrap a fake on the PATH), an unchanged recipe is up to date, and
// serve offers a block template with its recipe's languages.
func TestCLITemplateBuild(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("template build runs mmdebstrap as root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Fatalf("mkfs.ext4 not installed (e2fsprogs): %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	if err := os.WriteFile(filepath.Join(bin, "mmdebstrap"), []byte(fakeMmdebstrap), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	t.Setenv("FAKE_RUNS", filepath.Join(dir, "runs"))
	recipe := filepath.Join(dir, "py.toml")
	if err := os.WriteFile(recipe, []byte("languages = [\"python\", \"sh\"]\nsize = \"64Mi\"\npackages = [\"python3\"]\n[base]\nsuite = \"bookworm\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := []string{"--store", filepath.Join(dir, "store"), "--node-key", filepath.Join(dir, "node.key")}
	e := newEnv(t)
	build := func(args ...string) result {
		return e.run("", append(append([]string{"template", "build"}, args...), append(store, "--cache", filepath.Join(dir, "cache"))...)...)
	}
	if r := build("py", "-f", recipe); r.code != 0 || !strings.Contains(r.stdout, "template py: built from recipe") || !strings.Contains(r.stdout, "(tree built)") || !strings.Contains(r.stdout, "languages python, sh") {
		t.Fatalf("build: %+v", r)
	}
	if r := build("py", "-f", recipe); r.code != 0 || !strings.Contains(r.stdout, "template py is up to date") {
		t.Fatalf("second build: %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "runs")); strings.Count(string(b), "run") != 1 {
		t.Fatalf("mmdebstrap ran %d times, want 1", strings.Count(string(b), "run"))
	}
	// --tree-only: the tree into the cache (built once), no template.
	node := filepath.Join(dir, "node.toml")
	if err := os.WriteFile(node, []byte("packages = [\"nodejs\"]\n[base]\nsuite = \"bookworm\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{": built, ", ": in the cache, "} {
		if r := build("node", "-f", node, "--tree-only"); r.code != 0 || !strings.Contains(r.stdout, "tree of node (") || !strings.Contains(r.stdout, want) {
			t.Fatalf("tree-only %d: %+v, want %q", i, r, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "runs")); strings.Count(string(b), "run") != 2 {
		t.Fatalf("mmdebstrap ran %d times, want 2", strings.Count(string(b), "run"))
	}
	if r := e.run("", append([]string{"template", "ls"}, store...)...); r.code != 0 || !strings.Contains(r.stdout, "py") || strings.Contains(r.stdout, "node") {
		t.Fatalf("template ls: %+v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"py"}, "needs the recipe"},
		{[]string{"py", "-f", filepath.Join(dir, "none.toml")}, "no such file"},
	} {
		if r := build(c.args...); r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("build %q: %+v, want usage error with %q", c.args, r, c.want)
		}
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("packages = [\"x y\"]\n[base]\nsuite = \"bookworm\"\n"), 0o644)
	if r := build("bad", "-f", bad); r.code != exitUsage || !strings.Contains(r.stderr, "not a Debian package name") {
		t.Errorf("bad recipe: %+v", r)
	}

	// --root overlay: only the tree, in the templates dir; no block
	// template; the same again is up to date. Refused without a
	// templates dir, and for --image imports.
	if r := build("pyo", "-f", recipe, "--root", "overlay"); r.code != exitUsage || !strings.Contains(r.stderr, "--root overlay keeps only the template's tree") {
		t.Fatalf("--root overlay without a templates dir: %+v", r)
	}
	trees := filepath.Join(dir, "templates") // ctld's, beside the store
	if err := os.Mkdir(trees, 0o755); err != nil {
		t.Fatal(err)
	}
	if r := build("pyo", "-f", recipe, "--root", "overlay"); r.code != 0 || !strings.Contains(r.stdout, "(tree from the cache), overlay tree only") {
		t.Fatalf("--root overlay: %+v", r)
	}
	if b, err := os.ReadFile(filepath.Join(trees, "pyo", "etc", "os-release")); err != nil || string(b) != "fake\n" {
		t.Fatalf("the overlay tree's file: %q, %v", b, err)
	}
	if r := build("pyo", "-f", recipe, "--root", "overlay"); r.code != 0 || !strings.Contains(r.stdout, "template pyo is up to date") {
		t.Fatalf("--root overlay again: %+v", r)
	}
	if r := e.run("", append([]string{"template", "ls"}, store...)...); r.code != 0 || !regexp.MustCompile(`(?m)^pyo +- +- +\(overlay tree only\)$`).MatchString(r.stdout) {
		t.Fatalf("template ls after an overlay-only build: %+v", r)
	}
	if r := e.run("", append([]string{"template", "import", "x", "--image", "127.0.0.1:1/x:1", "--root", "overlay"}, store...)...); r.code != exitUsage || !strings.Contains(r.stderr, "--root overlay is for local sources") {
		t.Fatalf("--root overlay --image: %+v", r)
	}
	if r := build("pyx", "-f", recipe, "--root", "tree"); r.code != exitUsage || !strings.Contains(r.stderr, "want both, block or overlay") {
		t.Fatalf("--root tree: %+v", r)
	}

	// serve: the templates' languages come from their recipes, in either
	// root mode.
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	base, stop := e.startServe(append([]string{"--listen", "127.0.0.1:0", "--template", "busybox:overlay:sh", "--template", "py:block", "--template", "pyo:overlay"}, store...)...)
	defer stop()
	tpls, err := (&client.Client{BaseURL: base, Key: key}).Templates(context.Background())
	if err != nil || len(tpls) != 3 || strings.Join(tpls[1].Languages, ",") != "python,sh" || strings.Join(tpls[0].Languages, ",") != "sh" || strings.Join(tpls[2].Languages, ",") != "python,sh" {
		t.Fatalf("templates = %+v, %v", tpls, err)
	}
}
