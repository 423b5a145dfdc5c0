package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// busyboxLayer is the busybox template (the host's static busybox) as a
// layer.
func busyboxLayer(t testing.TB) v1.Layer {
	t.Helper()
	bb, err := findBusybox()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := BuildBusybox(dir, bb); err != nil {
		t.Fatal(err)
	}
	return templatetest.GzLayer(t, templatetest.TarDir(t, dir))
}

func findBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("busybox not installed (busybox-static)")
}

// appLayer adds a user and group, a working dir and an entrypoint script.
func appLayer(t testing.TB) v1.Layer {
	return templatetest.GzLayer(t, mkTar(t, []tent{
		{h: regH("etc/passwd", 0o644, 0, 0), content: passwd + "app:x:1234:1000:app:/work:/bin/sh\n"},
		{h: regH("etc/group", 0o644, 0, 0), content: group + "staff:x:2345:\n"},
		{h: dirH("work/", 0o755, 1234, 2345)},
		{h: dirH("app/", 0o755, 0, 0)},
		{h: regH("app/entry.sh", 0o755, 0, 0), content: "#!/bin/sh\necho \"$GREETING from $(pwd) as $(id -u):$(id -g): $*\"\n"},
	}))
}

var appConfig = v1.Config{
	Entrypoint: []string{"/app/entry.sh"},
	Cmd:        []string{"default", "args"},
	Env:        []string{"PATH=/bin:/usr/bin", "GREETING=hello"},
	User:       "app:staff",
	WorkingDir: "/work",
}

func layerDigest(t testing.TB, l v1.Layer) string {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// storeKeys lists every object of the store under templates/.
func storeKeys(t *testing.T, st blockstore.Store) []string {
	t.Helper()
	keys, err := st.List(t.Context(), "templates/")
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func cacheBlobs(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestRegistryImport: an image pushed to a real registry (basic auth, the
// password from a docker config file) becomes a template whose metadata
// records its digest and config, with the user resolved inside the image;
// a second template sharing every layer downloads no blob again; a wrong
// password is refused and leaves nothing.
func TestRegistryImport(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	bb, app := busyboxLayer(t), appLayer(t)
	img := templatetest.Image(t, appConfig, bb, app)
	ref, digest := reg.Push("team/app:v1", img)
	cfg2 := appConfig
	cfg2.Env = []string{"GREETING=second"}
	ref2, _ := reg.Push("team/app2:v1", templatetest.Image(t, cfg2, bb, app))

	st, repo := templatetest.Repo(t)
	cache := t.TempDir()
	reg.DockerConfig(t, "wrong")
	if _, _, _, err := ImportImage(t.Context(), repo, "app", ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Fatalf("import with a wrong password = %v, want UNAUTHORIZED", err)
	}
	if k, c := storeKeys(t, st), cacheBlobs(t, cache); len(k) != 0 || len(c) != 0 {
		t.Fatalf("a refused pull left %v in the store, %v in the cache", k, c)
	}

	reg.DockerConfig(t, reg.Pass)
	var last PullProgress
	m, res, meta, err := ImportImage(t.Context(), repo, "app", ref, PullOptions{CacheDir: cache, Progress: func(p PullProgress) { last = p }}, ImageOptions{Size: 64 << 20}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported %s: %d entries, %d bytes, %d chunks", ref, res.Entries, res.Bytes, len(m.Entries))
	want := Meta{Source: "registry", Ref: ref, Digest: digest.String(), Platform: "linux/" + runtime.GOARCH,
		Config: ImageConfig{Entrypoint: appConfig.Entrypoint, Cmd: appConfig.Cmd, Env: appConfig.Env, WorkingDir: "/work", User: "app:staff", UID: 1234, GID: 2345},
		Layers: []string{layerDigest(t, bb), layerDigest(t, app)}}
	got, ok, err := ReadMeta(t.Context(), repo, "app")
	if err != nil || !ok {
		t.Fatalf("ReadMeta = %v, %v", ok, err)
	}
	if !strings.HasPrefix(meta.Image, basePrefix) || res.Base != meta.Image || res.Reused {
		t.Errorf("first import: image %q, result %+v; want a fork of a new stored image", meta.Image, res)
	}
	want.Image = meta.Image
	for _, g := range []Meta{meta, got} {
		if fmt.Sprint(g) != fmt.Sprint(want) {
			t.Errorf("meta = %+v\nwant   %+v", g, want)
		}
	}
	if last.Layers != 2 || last.LayersDone != 2 || last.Cached != 0 || last.BytesDone != last.Bytes || last.Bytes == 0 {
		t.Errorf("last progress %+v", last)
	}
	for _, l := range []v1.Layer{bb, app} {
		d, _ := l.Digest()
		if n := reg.Gets(d); n != 1 {
			t.Errorf("layer %s fetched %d times, want 1", d, n)
		}
	}
	// The template reads back as the image's tree.
	img0 := exportTemplate(t, repo, "app")
	tree := imageTree(t, img0)
	if n := tree["app/entry.sh"]; n.Mode&0o777 != 0o755 || !strings.Contains(n.Content, "GREETING") {
		t.Errorf("app/entry.sh = %+v", n)
	}
	if n := tree["work"]; n.UID != 1234 || n.GID != 2345 {
		t.Errorf("work = %+v", n)
	}
	if n := tree["bin/sh"]; n.Target != "busybox" {
		t.Errorf("bin/sh = %+v", n)
	}

	before := reg.TotalGets()
	if _, _, meta2, err := ImportImage(t.Context(), repo, "app2", ref2, PullOptions{CacheDir: cache, Progress: func(p PullProgress) { last = p }}, ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil {
		t.Fatal(err)
	} else if meta2.Config.Env[0] != "GREETING=second" {
		t.Errorf("second template's config %+v", meta2.Config)
	}
	if n := reg.TotalGets() - before; n != 1 { // its config blob only
		t.Errorf("second template sharing every layer made %d blob GETs, want 1 (the config)", n)
	}
	if last.Cached != 2 {
		t.Errorf("second import's progress %+v: want 2 cached layers", last)
	}
	if _, _, _, err := ImportImage(t.Context(), repo, "app", ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, t.TempDir()); !errors.Is(err, ErrTemplateExists) {
		t.Errorf("import over an existing template = %v", err)
	}
	if err := Remove(t.Context(), st, repo, "app"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadMeta(t.Context(), repo, "app"); ok || err != nil {
		t.Errorf("metadata after rm: %v, %v", ok, err)
	}
}

// exportTemplate writes template name's generation 0 to an image file.
func exportTemplate(t *testing.T, repo *blockstore.Repo, name string) string {
	t.Helper()
	im, err := repo.Open(t.Context(), blockstore.GenRef{Volume: blockstore.Template(name)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "export.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, im.ChunkSize())
	for i := range im.Chunks() {
		if im.IsZero(i) {
			continue
		}
		if err := im.ReadChunk(t.Context(), i, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(buf, int64(i)*int64(len(buf))); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(int64(im.DeviceSize())); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// TestRegistryDigestPinning: REF@sha256 pulls that manifest; a registry
// that answers the digest with another manifest is refused.
func TestRegistryDigestPinning(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb := busyboxLayer(t)
	ref, digest := reg.Push("pin/a:v1", templatetest.Image(t, appConfig, bb, appLayer(t)))
	_, other := reg.Push("pin/a:other", templatetest.Image(t, v1.Config{Env: []string{"X=1"}}, bb))
	_, repo := templatetest.Repo(t)
	pinned := strings.TrimSuffix(ref, ":v1") + "@" + digest.String()
	if _, _, meta, err := ImportImage(t.Context(), repo, "pinned", pinned, PullOptions{CacheDir: t.TempDir()}, ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil || meta.Digest != digest.String() {
		t.Fatalf("pinned import: %+v, %v", meta, err)
	}
	reg.Rewrite(digest, other)
	st, repo := templatetest.Repo(t)
	cache := t.TempDir()
	_, _, _, err := ImportImage(t.Context(), repo, "pinned", pinned, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "does not match requested digest") {
		t.Fatalf("a manifest that is not the pinned digest: %v", err)
	}
	if k, c := storeKeys(t, st), cacheBlobs(t, cache); len(k) != 0 || len(c) != 0 {
		t.Fatalf("left %v in the store, %v in the cache", k, c)
	}
}

// TestRegistryIndexPlatform: a multi-arch index resolves to this
// machine's platform; an index without it is refused.
func TestRegistryIndexPlatform(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	mine := templatetest.Image(t, appConfig, busyboxLayer(t), appLayer(t))
	foreign, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	otherArch := "arm64"
	if runtime.GOARCH == "arm64" {
		otherArch = "amd64"
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	push := func(tag string, idx v1.ImageIndex) (string, v1.Hash) {
		r, err := name.ParseReference(reg.Host + "/multi:" + tag)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.WriteIndex(r, idx, reg.Auth()); err != nil {
			t.Fatal(err)
		}
		d, _ := idx.Digest()
		return r.String(), d
	}
	ref, idxDigest := push("v1", idx)
	mineDigest, _ := mine.Digest()
	_, repo := templatetest.Repo(t)
	_, _, meta, err := ImportImage(t.Context(), repo, "multi", ref, PullOptions{CacheDir: t.TempDir()}, ImageOptions{Size: 64 << 20}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if meta.Digest != mineDigest.String() || meta.IndexDigest != idxDigest.String() || meta.Platform != "linux/"+runtime.GOARCH || meta.Config.UID != 1234 {
		t.Errorf("meta %+v: want image %s of index %s", meta, mineDigest, idxDigest)
	}
	fd, _ := foreign.Layers()
	fdd, _ := fd[0].Digest()
	if n := reg.Gets(fdd); n != 0 {
		t.Errorf("the other platform's layer was fetched %d times", n)
	}
	ref2, _ := push("foreign-only", mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}}))
	st, repo := templatetest.Repo(t)
	if _, _, _, err := ImportImage(t.Context(), repo, "x", ref2, PullOptions{CacheDir: t.TempDir()}, ImageOptions{Size: 64 << 20}, t.TempDir()); !errors.Is(err, ErrBadSource) || !strings.Contains(err.Error(), "no image for linux/"+runtime.GOARCH) {
		t.Errorf("index without this platform: %v", err)
	}
	if k := storeKeys(t, st); len(k) != 0 {
		t.Errorf("left %v", k)
	}
}

// TestRegistryInterruptedPull: a blob cut mid-way once is downloaded
// again in the same pull; cut on every try, the pull fails, keeps the
// layers it finished, and the next pull fetches only the missing one.
func TestRegistryInterruptedPull(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb, app := busyboxLayer(t), appLayer(t)
	ref, _ := reg.Push("cut/app:v1", templatetest.Image(t, appConfig, bb, app))
	bbd, _ := bb.Digest()
	appd, _ := app.Digest()

	reg.Cut(bbd, 1)
	_, repo := templatetest.Repo(t)
	if _, _, _, err := ImportImage(t.Context(), repo, "once", ref, PullOptions{CacheDir: t.TempDir()}, ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil {
		t.Fatalf("a pull cut once: %v", err)
	}
	if n := reg.Gets(bbd); n != 2 {
		t.Errorf("cut layer fetched %d times, want 2", n)
	}

	cache := t.TempDir()
	reg.Cut(appd, 2)
	st, repo := templatetest.Repo(t)
	_, _, _, err := ImportImage(t.Context(), repo, "again", ref, PullOptions{CacheDir: cache, Attempts: 2}, ImageOptions{Size: 64 << 20}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "layer 1") {
		t.Fatalf("a pull cut on every try: %v", err)
	}
	t.Logf("cut pull: %v", err)
	if k := storeKeys(t, st); len(k) != 0 {
		t.Fatalf("a failed pull left %v in the store", k)
	}
	if c := cacheBlobs(t, cache); len(c) != 1 || c[0] != bbd.Hex {
		t.Fatalf("cache after the failed pull: %v, want the finished layer %s", c, bbd.Hex)
	}
	b4, a4 := reg.Gets(bbd), reg.Gets(appd)
	if _, _, _, err := ImportImage(t.Context(), repo, "again", ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil {
		t.Fatalf("the next pull: %v", err)
	}
	if b, a := reg.Gets(bbd)-b4, reg.Gets(appd)-a4; b != 0 || a != 1 {
		t.Errorf("the next pull fetched the finished layer %d times, the missing one %d times; want 0 and 1", b, a)
	}
}

// artifact is a manifest of a media type that is not an image.
type artifact struct{ raw []byte }

func (a artifact) RawManifest() ([]byte, error) { return a.raw, nil }
func (a artifact) MediaType() (types.MediaType, error) {
	return "application/vnd.example.artifact.v1+json", nil
}

// TestRegistryBadInput: hostile images are refused with a clear error and
// leave nothing in the template store or the layer cache (not even the
// good layers downloaded with them).
func TestRegistryBadInput(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	bb := busyboxLayer(t)
	hugeTar := func() []byte { // a header claiming 10 GiB, then 1 KiB of it
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "sparse", Mode: 0o644, Size: 10 << 30, ModTime: time.Unix(1, 0)})
		tw.Write(make([]byte, 1024))
		return b.Bytes()
	}
	plainTar := mkTar(t, []tent{{h: regH("plain", 0o644, 0, 0), content: "not gzip"}})
	cases := []struct {
		name  string
		layer func() v1.Layer
		ref   func() string
		want  error
		msg   string
	}{
		{name: "dotdot", layer: func() v1.Layer {
			return templatetest.GzLayer(t, mkTar(t, []tent{{h: regH("etc/../../escape", 0o644, 0, 0), content: "x"}}))
		}, want: ErrUnsafePath, msg: `unsafe tar path "../escape"`},
		{name: "sparse-10gib", layer: func() v1.Layer { return templatetest.GzLayer(t, hugeTar()) }, want: ErrImageTooSmall, msg: "file sparse of 10737418240 bytes"},
		{name: "not-gzip", layer: func() v1.Layer { return static.NewLayer(plainTar, types.OCILayer) }, want: ErrBadSource, msg: "does not start with its magic"},
		{name: "artifact-manifest", ref: func() string {
			r, err := name.ParseReference(reg.Host + "/bad/artifact:v1")
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Put(r, artifact{raw: []byte(`{"schemaVersion":2,"mediaType":"application/vnd.example.artifact.v1+json"}`)}, reg.Auth()); err != nil {
				t.Fatal(err)
			}
			return r.String()
		}, want: ErrBadSource, msg: `manifest of media type "application/vnd.example.artifact.v1+json" is not an image`},
		{name: "user-not-in-passwd", layer: func() v1.Layer {
			return templatetest.GzLayer(t, mkTar(t, []tent{{h: regH("marker", 0o644, 0, 0), content: "x"}}))
		}, want: ErrBadSource, msg: `image user "app" is not in the image's /etc/passwd`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ref string
			if c.ref != nil {
				ref = c.ref()
			} else {
				cfg := v1.Config{}
				if c.name == "user-not-in-passwd" {
					cfg.User = "app"
				}
				ref, _ = reg.Push("bad/"+c.name+":v1", templatetest.Image(t, cfg, bb, c.layer()))
			}
			st, repo := templatetest.Repo(t)
			cache, work := t.TempDir(), t.TempDir()
			_, _, _, err := ImportImage(t.Context(), repo, "bad", ref, PullOptions{CacheDir: cache}, ImageOptions{Size: 64 << 20}, work)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("import = %v\nwant %v with %q", err, c.want, c.msg)
			}
			t.Logf("refused: %v", err)
			if k, cb, w := storeKeys(t, st), cacheBlobs(t, cache), onlyFiles(t, work); len(k) != 0 || len(cb) != 0 || len(w) != 0 {
				t.Fatalf("left %v in the store, %v in the cache, %v in the work dir", k, cb, w)
			}
		})
	}
}

// TestRegistryDevicesAndSymlinks: device nodes in a layer are skipped and
// listed (the runtime provides /dev), as for every other source; an
// absolute symlink to a host directory with a file "through" it in an
// upper layer writes nothing outside the tree.
func TestRegistryDevicesAndSymlinks(t *testing.T) {
	needTools(t)
	reg := templatetest.NewRegistry(t)
	reg.DockerConfig(t, reg.Pass)
	outside := t.TempDir()
	dev := templatetest.GzLayer(t, mkTar(t, []tent{
		{h: tar.Header{Typeflag: tar.TypeChar, Name: "dev/kmem", Mode: 0o666, Devmajor: 1, Devminor: 2}},
		{h: linkH("out", outside)},
	}))
	through := templatetest.GzLayer(t, mkTar(t, []tent{{h: regH("out/evil", 0o644, 0, 0), content: "x"}}))
	ref, _ := reg.Push("dev/app:v1", templatetest.Image(t, v1.Config{}, busyboxLayer(t), dev, through))
	_, repo := templatetest.Repo(t)
	_, res, _, err := ImportImage(t.Context(), repo, "dev", ref, PullOptions{CacheDir: t.TempDir()}, ImageOptions{Size: 64 << 20}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Skipped) != 1 || res.Skipped[0].Path != "dev/kmem" {
		t.Fatalf("skipped %+v", res.Skipped)
	}
	tree := imageTree(t, exportTemplate(t, repo, "dev"))
	if _, ok := tree["dev/kmem"]; ok {
		t.Fatal("device node in the template")
	}
	if n := tree["out"]; n.Target != outside {
		t.Errorf("out = %+v, want a symlink to %s", n, outside)
	}
	if left := onlyFiles(t, outside); len(left) != 0 {
		t.Fatalf("the import wrote %v outside its tree", left)
	}
}
