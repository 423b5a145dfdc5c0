package recipe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/fsutil"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/template"
)

// scriptPath is where the commands' script is in the tree while it runs.
const scriptPath = "/ctl-recipe.sh"

// safeDir: the build's own paths go into mmdebstrap's hook strings (run
// by sh): no spaces, quotes or shell characters.
var safeDir = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

// Args is mmdebstrap's command line that builds r's tree at out, with
// the files' contents staged in stage (file i at stage/i) and the
// commands in script. Every hook is a fixed string around validated
// paths; the files go in and their modes are set inside the chroot, so a
// symlink of the tree resolves within it.
func Args(r Recipe, stage, script, out string) []string {
	r = r.normal()
	args := []string{"--mode=root", "--format=directory", "--variant=" + r.Base.Variant}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	hook := func(h string) { args = append(args, "--customize-hook="+h) }
	for i, f := range r.Files {
		hook(`chroot "$1" mkdir -p ` + path.Dir(f.Path))
		hook("upload " + filepath.Join(stage, strconv.Itoa(i)) + " " + f.Path)
		hook(`chroot "$1" chmod ` + f.Mode + " " + f.Path)
	}
	if len(r.Commands) > 0 {
		hook("upload " + script + " " + scriptPath)
		hook(`chroot "$1" /bin/sh -e ` + scriptPath)
		hook(`rm -f "$1` + scriptPath + `"`)
	}
	return append(args, r.Base.Suite, out, r.Base.Mirror)
}

// Script is the commands as one shell script (each a line of it).
func Script(r Recipe) []byte {
	var b strings.Builder
	b.WriteString("set -eu\n")
	for _, c := range r.Commands {
		b.WriteString(c)
		b.WriteString("\n")
	}
	return []byte(b.String())
}

// Builder builds recipes' trees into a cache: <CacheDir>/<tree digest>/root,
// complete once <CacheDir>/<tree digest>/recipe.json exists (it is
// written before the directory is renamed into place).
type Builder struct {
	CacheDir string
	// Mmdebstrap is the program ("": mmdebstrap on the PATH).
	Mmdebstrap string
	// Output gets mmdebstrap's output (nil: discarded).
	Output io.Writer
	Log    *slog.Logger
	// Trees, if set, is where Build keeps a template's tree as its overlay
	// lower too (ctld's templates directory).
	Trees template.Trees
	// TreeOnly: Build keeps only the overlay tree in Trees (no block
	// image): the template serves overlay claims only.
	TreeOnly bool
}

// Tree returns the root of r's tree, built when the cache has none; hit
// says it came from the cache.
func (b Builder) Tree(ctx context.Context, r Recipe) (root string, hit bool, err error) {
	r = r.normal()
	if err := r.Validate(); err != nil {
		return "", false, err
	}
	if r.Base.Template != "" {
		return "", false, fmt.Errorf("build recipe: its base is template %s: Resolve it first", r.Base.Template)
	}
	if !safeDir.MatchString(b.CacheDir) {
		return "", false, fmt.Errorf("build recipe: cache directory %q: an absolute path of letters, digits and ._-", b.CacheDir)
	}
	d := r.TreeDigest()
	final := filepath.Join(b.CacheDir, d)
	if _, err := os.Stat(filepath.Join(final, "recipe.json")); err == nil {
		return filepath.Join(final, "root"), true, nil
	}
	if os.Geteuid() != 0 {
		return "", false, errors.New("build recipe: mmdebstrap's root mode needs root (the tree's files belong to root and its packages' scripts run in a chroot)")
	}
	if err := os.MkdirAll(b.CacheDir, 0o700); err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	work, err := os.MkdirTemp(b.CacheDir, ".build-"+d[:16]+"-")
	if err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(work)
		}
	}()
	stage, script, out := filepath.Join(work, "stage"), filepath.Join(work, "commands.sh"), filepath.Join(work, "root")
	if err := os.Mkdir(stage, 0o700); err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	n := r.normal()
	for i, f := range n.Files {
		if err := os.WriteFile(filepath.Join(stage, strconv.Itoa(i)), []byte(f.Content), 0o600); err != nil {
			return "", false, fmt.Errorf("build recipe: stage %s: %w", f.Path, err)
		}
	}
	if err := os.WriteFile(script, Script(n), 0o700); err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	prog := b.Mmdebstrap
	if prog == "" {
		prog = "mmdebstrap"
	}
	cmd := exec.CommandContext(ctx, prog, Args(n, stage, script, out)...)
	cmd.Stdout, cmd.Stderr = b.Output, b.Output
	logging.OrDiscard(b.Log).Info("building a recipe's tree", "digest", d, "suite", n.Base.Suite, "packages", len(n.Packages))
	if err := cmd.Run(); err != nil {
		return "", false, fmt.Errorf("build recipe: %s: %w", prog, err)
	}
	if fi, err := os.Stat(out); err != nil || !fi.IsDir() {
		return "", false, fmt.Errorf("build recipe: %s made no directory at %s", prog, out)
	}
	if err := os.RemoveAll(stage); err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	os.Remove(script)
	rec, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(work, "recipe.json"), rec, 0o600); err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	if err := os.Rename(work, final); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			// Another build of the same recipe finished first: use its.
			return filepath.Join(final, "root"), true, nil
		}
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	done = true
	if err := fsutil.SyncDir(b.CacheDir); err != nil {
		return "", false, fmt.Errorf("build recipe: %w", err)
	}
	return filepath.Join(final, "root"), false, nil
}
