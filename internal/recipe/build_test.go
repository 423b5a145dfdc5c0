package recipe

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// fakeMmdebstrap stands for mmdebstrap: it counts its runs in the file
// $FAKE_RUNS, makes the target directory with a file, carries out the
// upload hooks and fails when $FAKE_FAIL is set.
const fakeMmdebstrap = `#!/bin/sh
echo run >> "$FAKE_RUNS"
[ -z "$FAKE_FAIL" ] || { echo "E: fake failure" >&2; exit 1; }
eval out=\${$(($# - 1))}
mkdir -p "$out/etc" "$out/bin"
echo fake > "$out/etc/os-release"
for a in "$@"; do
	case "$a" in
	"--customize-hook=upload "*)
		set -- $a
		mkdir -p "$out$(dirname "$3")"
		cp "$2" "$out$3";;
	esac
done
`

func needRootAndMkfs(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("recipe builds run as root (mmdebstrap's root mode)")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("needs mkfs.ext4 (e2fsprogs)")
	}
}

func runs(t *testing.T, p string) int {
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

// TestBuildCachesAndRecords: a recipe's tree is built once and cached by
// its digest; the template is imported from it and its record written;
// the same recipe again is up to date (nothing runs), another recipe
// under the same name is refused, a removed template comes back from the
// cache, and a failed build leaves neither a template nor a cache entry.
func TestBuildCachesAndRecords(t *testing.T) {
	needRootAndMkfs(t)
	dir := t.TempDir()
	fake := filepath.Join(dir, "mmdebstrap")
	if err := os.WriteFile(fake, []byte(fakeMmdebstrap), 0o755); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(dir, "runs")
	t.Setenv("FAKE_RUNS", count)
	t.Setenv("FAKE_FAIL", "")
	st, repo := templatetest.Repo(t)
	b := Builder{CacheDir: filepath.Join(dir, "cache"), Mmdebstrap: fake}
	ctx := context.Background()
	r, err := Parse([]byte("languages = [\"sh\", \"python\"]\npackages = [\"python3\"]\n[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/app/conf\"\ncontent = \"hello\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	build := func(name string, r Recipe) (Outcome, error) {
		return Build(ctx, st, repo, b, name, r, 64<<20, t.TempDir(), nil)
	}

	out, err := build("py", r)
	if err != nil || out.UpToDate || out.TreeCached || out.Image.Entries == 0 || runs(t, count) != 1 {
		t.Fatalf("first build = %+v, %v (runs %d)", out, err, runs(t, count))
	}
	if got, err := os.ReadFile(filepath.Join(b.CacheDir, r.TreeDigest(), "root", "etc", "app", "conf")); err != nil || string(got) != "hello" {
		t.Fatalf("the file in the tree = %q, %v", got, err)
	}
	rec, ok, err := ReadRecord(ctx, st, "py")
	if err != nil || !ok || rec.Digest != r.Digest() || rec.TreeDigest != r.TreeDigest() || !slices.Equal(rec.Languages, []string{"python", "sh"}) || rec.Recipe.Packages[0] != "python3" {
		t.Fatalf("record = %+v, %v, %v", rec, ok, err)
	}

	// The same recipe: up to date, nothing runs.
	out, err = build("py", r)
	if err != nil || !out.UpToDate || runs(t, count) != 1 {
		t.Fatalf("second build = %+v, %v (runs %d)", out, err, runs(t, count))
	}
	// Another recipe under the name: refused, the template unchanged.
	other := r
	other.Commands = []string{"true"}
	if _, err := build("py", other); !errors.Is(err, template.ErrTemplateExists) || !strings.Contains(err.Error(), "built from another recipe") {
		t.Fatalf("another recipe under py: %v", err)
	}
	// Another template of the same tree: from the cache.
	out, err = build("py2", r)
	if err != nil || !out.TreeCached || runs(t, count) != 1 {
		t.Fatalf("py2 = %+v, %v (runs %d)", out, err, runs(t, count))
	}
	// Removed, then built again: from the cache; the record went with it.
	if err := template.Remove(ctx, st, repo, "py"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadRecord(ctx, st, "py"); ok || err != nil {
		t.Fatalf("record after template rm: %v, %v", ok, err)
	}
	if out, err = build("py", r); err != nil || !out.TreeCached || runs(t, count) != 1 {
		t.Fatalf("rebuild = %+v, %v (runs %d)", out, err, runs(t, count))
	}
	// A template not from a recipe is not replaced.
	if _, _, err := template.ImportSource(ctx, repo, "plain", template.Source{Kind: template.KindDir, Path: filepath.Join(b.CacheDir, r.TreeDigest(), "root")},
		template.ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := build("plain", r); !errors.Is(err, template.ErrTemplateExists) || !strings.Contains(err.Error(), "not built from a recipe") {
		t.Fatalf("build over a plain template: %v", err)
	}

	// A failed build: no template, no cache entry, no work directory.
	t.Setenv("FAKE_FAIL", "1")
	if _, err := build("broken", other); err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("failed build: %v", err)
	}
	ents, _ := os.ReadDir(b.CacheDir)
	if len(ents) != 1 || ents[0].Name() != r.TreeDigest() {
		t.Fatalf("cache after a failed build: %v", ents)
	}
	infos, err := template.List(ctx, st, repo)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	if !slices.Equal(names, []string{"plain", "py", "py2"}) {
		t.Fatalf("templates = %q", names)
	}
}

// TestBuildOnTemplate: a recipe whose base is a recipe template is that
// template's recipe with its own packages, files (its own where both
// have a path) and commands added, built as one recipe and cached; the
// same again is up to date, and out of date once the base is built from
// another recipe; a base that is not a recipe template is refused.
func TestBuildOnTemplate(t *testing.T) {
	needRootAndMkfs(t)
	dir := t.TempDir()
	fake := filepath.Join(dir, "mmdebstrap")
	if err := os.WriteFile(fake, []byte(fakeMmdebstrap), 0o755); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(dir, "runs")
	t.Setenv("FAKE_RUNS", count)
	t.Setenv("FAKE_FAIL", "")
	st, repo := templatetest.Repo(t)
	b := Builder{CacheDir: filepath.Join(dir, "cache"), Mmdebstrap: fake}
	ctx := context.Background()
	parse := func(s string) Recipe {
		t.Helper()
		r, err := Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	build := func(name string, r Recipe) (Outcome, error) {
		return Build(ctx, st, repo, b, name, r, 64<<20, t.TempDir(), nil)
	}
	base := parse("languages = [\"sh\"]\npackages = [\"python3\"]\ncommands = [\"echo base\"]\n[base]\nsuite = \"bookworm\"\n" +
		"[[file]]\npath = \"/etc/app/conf\"\ncontent = \"base\"\n[[file]]\npath = \"/etc/app/keep\"\ncontent = \"kept\"\n")
	if _, err := build("base", base); err != nil {
		t.Fatal(err)
	}
	onBase := parse("size = \"32Mi\"\nlanguages = [\"python\"]\npackages = [\"git\"]\ncommands = [\"echo mine\"]\n[base]\ntemplate = \"base\"\n" +
		"[[file]]\npath = \"/etc/app/conf\"\ncontent = \"mine\"\n")
	out, err := build("app", onBase)
	if err != nil || out.UpToDate || out.TreeCached || runs(t, count) != 2 {
		t.Fatalf("build on the base = %+v, %v (runs %d)", out, err, runs(t, count))
	}
	res := out.Record.Resolved
	if res == nil || res.Base.Suite != "bookworm" || !slices.Equal(res.Packages, []string{"git", "python3"}) ||
		!slices.Equal(res.Commands, []string{"echo base", "echo mine"}) || !slices.Equal(out.Record.Languages, []string{"python", "sh"}) ||
		res.Size != "32Mi" || out.Record.TreeDigest != res.TreeDigest() {
		t.Fatalf("resolved recipe %+v, record %+v", res, out.Record)
	}
	for file, want := range map[string]string{"conf": "mine", "keep": "kept"} {
		if got, err := os.ReadFile(filepath.Join(b.CacheDir, res.TreeDigest(), "root", "etc", "app", file)); err != nil || string(got) != want {
			t.Errorf("/etc/app/%s in the tree = %q, %v; want %q", file, got, err, want)
		}
	}
	if out, err := build("app", onBase); err != nil || !out.UpToDate {
		t.Fatalf("the same again = %+v, %v", out, err)
	}
	// The base built anew from another recipe: app's recipe is out of date.
	if err := template.Remove(ctx, st, repo, "base"); err != nil {
		t.Fatal(err)
	}
	base.Commands = []string{"echo base2"}
	if _, err := build("base", base); err != nil {
		t.Fatal(err)
	}
	if _, err := build("app", onBase); !errors.Is(err, template.ErrTemplateExists) || !strings.Contains(err.Error(), "built from another recipe") {
		t.Fatalf("app after its base changed: %v", err)
	}
	// Bases that are not recipe templates.
	if _, _, err := template.ImportSource(ctx, repo, "plain", template.Source{Kind: template.KindDir, Path: filepath.Join(b.CacheDir, base.TreeDigest(), "root")},
		template.ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain", "missing"} {
		r := onBase
		r.Base.Template = name
		if _, err := build("app2", r); !errors.Is(err, template.ErrTemplateNotFound) || !strings.Contains(err.Error(), "not built from a recipe") {
			t.Errorf("base %s: %v", name, err)
		}
	}
	if _, err := Parse([]byte("[base]\ntemplate = \"base\"\nsuite = \"bookworm\"\n")); err == nil || !strings.Contains(err.Error(), "with base.suite") {
		t.Errorf("template and suite: %v", err)
	}
}

// TestBuildTreeOnly: a build for overlay only keeps the recipe's tree in
// the templates directory and its record, and builds no block image; the
// same again is up to date; a build of the name for both root modes is
// refused (the template has no block image), as is a tree-only build
// over a block-only template of the same recipe; rm removes tree and
// record.
func TestBuildTreeOnly(t *testing.T) {
	needRootAndMkfs(t)
	dir := t.TempDir()
	fake := filepath.Join(dir, "mmdebstrap")
	if err := os.WriteFile(fake, []byte(fakeMmdebstrap), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_RUNS", filepath.Join(dir, "runs"))
	t.Setenv("FAKE_FAIL", "")
	st, repo := templatetest.Repo(t)
	mounts := filepath.Join(dir, "mountinfo")
	if err := os.WriteFile(mounts, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	trees := template.Trees{Dir: t.TempDir(), Mountinfo: mounts}
	overlay := Builder{CacheDir: filepath.Join(dir, "cache"), Mmdebstrap: fake, Trees: trees, TreeOnly: true}
	both := overlay
	both.TreeOnly = false
	blockOnly := Builder{CacheDir: overlay.CacheDir, Mmdebstrap: fake}
	ctx := context.Background()
	r, err := Parse([]byte("languages = [\"sh\"]\n[base]\nsuite = \"bookworm\"\n[[file]]\npath = \"/etc/app/conf\"\ncontent = \"hello\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	build := func(b Builder, name string) (Outcome, error) {
		return Build(ctx, st, repo, b, name, r, 64<<20, t.TempDir(), nil)
	}
	out, err := build(overlay, "py")
	if err != nil || out.UpToDate || out.Manifest != nil || out.Image.Entries == 0 {
		t.Fatalf("tree-only build = %+v, %v", out, err)
	}
	if got, err := os.ReadFile(filepath.Join(trees.Dir, "py", "etc", "app", "conf")); err != nil || string(got) != "hello" {
		t.Fatalf("the tree's file = %q, %v", got, err)
	}
	if infos, err := template.List(ctx, st, repo); err != nil || len(infos) != 0 {
		t.Fatalf("block templates after a tree-only build: %+v, %v", infos, err)
	}
	if rec, ok, err := ReadRecord(ctx, st, "py"); err != nil || !ok || rec.Digest != r.Digest() {
		t.Fatalf("record = %+v, %v, %v", rec, ok, err)
	}
	if out, err := build(overlay, "py"); err != nil || !out.UpToDate {
		t.Fatalf("the same again = %+v, %v", out, err)
	}
	if _, err := build(both, "py"); !errors.Is(err, template.ErrTemplateExists) || !strings.Contains(err.Error(), "overlay tree only") {
		t.Fatalf("both root modes over a tree-only py: %v", err)
	}
	if _, err := build(blockOnly, "blk"); err != nil {
		t.Fatal(err)
	}
	if _, err := build(overlay, "blk"); !errors.Is(err, template.ErrTemplateExists) || !strings.Contains(err.Error(), "without an overlay tree") {
		t.Fatalf("tree-only over a block-only blk: %v", err)
	}
	if err := trees.RemoveTemplate(ctx, st, repo, "py"); err != nil {
		t.Fatal(err)
	}
	if ok, err := trees.Has("py"); ok || err != nil {
		t.Fatalf("tree after rm: %v, %v", ok, err)
	}
	if _, ok, err := ReadRecord(ctx, st, "py"); ok || err != nil {
		t.Fatalf("record after rm: %v, %v", ok, err)
	}
}
