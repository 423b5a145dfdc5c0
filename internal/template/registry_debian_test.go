package template

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ctld/ctld/internal/template/templatetest"
)

// defaultRecipeCache is where test/recipe/setup.sh caches the shipped
// recipes' trees (CTLD_RECIPE_CACHE overrides it).
const defaultRecipeCache = "/var/cache/ctld-recipes"

// debianTree is a real Debian rootfs: the tree of the shipped python
// recipe (bookworm minbase with python3, made by mmdebstrap) that
// test/recipe/setup.sh cached (the unit stage runs it; the VM shares the
// cache and has no mirror). It returns the tree and the cache entry's name
// (the recipe's digest, so the tree never changes under that name).
func debianTree(t testing.TB) (root, digest string) {
	t.Helper()
	cache := os.Getenv("CTLD_RECIPE_CACHE")
	if cache == "" {
		cache = defaultRecipeCache
	}
	es, err := os.ReadDir(cache)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(cache, e.Name(), "recipe.json"))
		if err != nil {
			continue
		}
		var r struct {
			Packages []string
			Base     struct{ Suite, Variant string }
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s/recipe.json: %v", e.Name(), err)
		}
		if r.Base.Suite == "bookworm" && r.Base.Variant == "minbase" && slices.Contains(r.Packages, "python3") {
			return filepath.Join(cache, e.Name(), "root"), e.Name()
		}
	}
	t.Fatalf("no tree of a bookworm minbase recipe with python3 (templates/python.toml) in %s: run test/recipe/setup.sh (root, the Debian mirror)", cache)
	return "", ""
}

// debianLayer is the tree as a gzip layer, cached beside the Go build
// cache by the tree's digest: tar and gzip of ~220 MiB take seconds, and
// a cached layer makes a second run skip them. Unwritable cache: built
// into the test's temp dir.
func debianLayer(t testing.TB, root, digest string) v1.Layer {
	t.Helper()
	dir, err := os.UserCacheDir()
	if err == nil {
		dir = filepath.Join(dir, "ctld-test")
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, "debian-"+digest[:32]+".tar.gz")
	if _, err := os.Stat(path); err != nil {
		t0 := time.Now()
		f, err := os.CreateTemp(dir, ".debian-*.tar.gz")
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(f.Name())
		zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
		err = templatetest.WriteTarDir(zw, root, true)
		if err == nil {
			err = zw.Close()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), path)
		}
		if err != nil {
			t.Fatalf("layer of %s: %v", root, err)
		}
		t.Logf("built the Debian layer %s in %v", path, time.Since(t0).Round(time.Millisecond))
	}
	l, err := tarball.LayerFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRegistryDebianImage: an image of a real Debian rootfs (the python
// recipe's bookworm tree) plus an app layer that deletes a file of it
// (a whiteout) and adds one, pushed to the loopback registry, becomes a
// template: its user resolved in Debian's /etc/passwd and /etc/group, the
// rootfs's device nodes skipped and reported, and the block image holds
// Debian's files byte for byte, the app's file, and not the deleted one.
func TestRegistryDebianImage(t *testing.T) {
	needTools(t)
	root, digest := debianTree(t)
	reg := templatetest.NewRegistry(t)
	deb := debianLayer(t, root, digest)
	app := templatetest.GzLayer(t, mkTar(t, []tent{
		{h: regH("etc/.wh.ctl-template", 0o644, 0, 0)},
		{h: dirH("srv/app/", 0o755, 0, 0)},
		{h: regH("srv/app/hello.py", 0o644, 0, 0), content: "print('hello from debian')\n"},
	}))
	cfg := v1.Config{Cmd: []string{"python3", "/srv/app/hello.py"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, User: "user", WorkingDir: "/home/user"}
	ref, dg := reg.Push("debian/python:bookworm", templatetest.Image(t, cfg, deb, app))
	reg.DockerConfig(t, reg.Pass)

	_, repo := templatetest.Repo(t)
	t0 := time.Now()
	_, res, meta, err := ImportImage(t.Context(), repo, "debian", ref, PullOptions{CacheDir: t.TempDir()}, ImageOptions{Size: 512 << 20}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported %s in %v: %d entries, %d bytes, skipped %d", ref, time.Since(t0).Round(time.Millisecond), res.Entries, res.Bytes, len(res.Skipped))
	if meta.Digest != dg.String() || len(meta.Layers) != 2 || meta.Layers[0] != layerDigest(t, deb) {
		t.Errorf("meta %+v", meta)
	}
	if c := meta.Config; c.UID != 1000 || c.GID != 1000 || c.User != "user" || c.WorkingDir != "/home/user" || !slices.Equal(c.Cmd, cfg.Cmd) || !slices.Equal(c.Env, cfg.Env) {
		t.Errorf("config %+v: want user (1000:1000 from Debian's passwd and group), /home/user, %q", c, cfg.Cmd)
	}
	var devs []string
	for _, s := range res.Skipped {
		devs = append(devs, s.Path)
	}
	if !slices.Contains(devs, "dev/null") || !slices.Contains(devs, "dev/console") {
		t.Errorf("skipped %q: want Debian's device nodes (dev/null, dev/console)", devs)
	}

	img := exportTemplate(t, repo, "debian")
	files := []string{"etc/debian_version", "etc/passwd", "usr/bin/dash", "usr/bin/python3.11", "usr/lib/python3.11/os.py", "srv/app/hello.py"}
	out := t.TempDir()
	var cmds []string
	for i, f := range files {
		cmds = append(cmds, fmt.Sprintf("dump /%s %s/%d", f, out, i))
	}
	cmds = append(cmds, "stat /etc/ctl-template", "stat /usr/bin/python3", "stat /home/user")
	outs := debugfsBatch(t, img, cmds)
	for i, f := range files {
		want := []byte("print('hello from debian')\n")
		if f != "srv/app/hello.py" {
			if want, err = os.ReadFile(filepath.Join(root, f)); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := os.ReadFile(filepath.Join(out, fmt.Sprint(i))); err != nil || !bytes.Equal(got, want) {
			t.Errorf("/%s in the image: %d bytes (%v), differs from the %d expected", f, len(got), err, len(want))
		}
	}
	rest := outs[len(files):]
	if strings.Contains(rest[0], "Inode:") {
		t.Errorf("/etc/ctl-template survived its whiteout: %s", rest[0])
	}
	if !strings.Contains(rest[1], "Type: symlink") || !strings.Contains(rest[1], `Fast link dest: "python3.11"`) {
		t.Errorf("/usr/bin/python3: %s", rest[1])
	}
	if !strings.Contains(rest[2], "Type: directory") || !strings.Contains(rest[2], "User:  1000   Group:  1000") {
		t.Errorf("/home/user (made by the recipe's useradd): %s", rest[2])
	}
}
