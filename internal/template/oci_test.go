package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func layerOf(t *testing.T, es []tent) v1.Layer {
	t.Helper()
	b := mkTar(t, es)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is three layers: a random one (go-containerregistry's), a base
// tree, and an upper layer with a whiteout, an opaque directory and a
// changed file. want is the flattened tree.
func testImage(t *testing.T) (v1.Image, map[string]node) {
	t.Helper()
	d, r := uint32(syscall.S_IFDIR), uint32(syscall.S_IFREG)
	want := map[string]node{}
	rnd, err := random.Layer(2048, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rnd.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		n := strings.TrimPrefix(h.Name, "/")
		want[n] = node{Mode: r | uint32(h.Mode&0o7777), UID: h.Uid, GID: h.Gid, Content: string(b)}
		// Parents the random layer does not list are made 0755 root:root.
		for p := filepath.Dir(n); p != "."; p = filepath.Dir(p) {
			want[p] = node{Mode: d | 0o755}
		}
	}
	rc.Close()
	base := layerOf(t, []tent{
		{h: dirH("etc/", 0o755, 0, 0)},
		{h: regH("etc/keep", 0o644, 0, 0), content: "old"},
		{h: regH("etc/gone", 0o644, 0, 0), content: "deleted above"},
		{h: dirH("opq/", 0o755, 0, 0)},
		{h: regH("opq/old", 0o644, 0, 0), content: "hidden by opaque"},
		{h: dirH("bin/", 0o755, 0, 0)},
		{h: regH("bin/tool", 0o755, 1000, 1000), content: "#!/bin/sh\n"},
	})
	upper := layerOf(t, []tent{
		{h: regH("etc/.wh.gone", 0o644, 0, 0)},
		{h: regH("etc/keep", 0o600, 0, 0), content: "new"},
		{h: dirH("opq/", 0o700, 0, 0)},
		{h: regH("opq/.wh..wh..opq", 0o644, 0, 0)},
		{h: regH("opq/new", 0o644, 0, 0), content: "after opaque"},
	})
	img, err := mutate.AppendLayers(empty.Image, rnd, base, upper)
	if err != nil {
		t.Fatal(err)
	}
	want["."] = node{Mode: d | 0o755}
	want["etc"] = node{Mode: d | 0o755}
	want["etc/keep"] = node{Mode: r | 0o600, Content: "new"}
	want["opq"] = node{Mode: d | 0o700}
	want["opq/new"] = node{Mode: r | 0o644, Content: "after opaque"}
	want["bin"] = node{Mode: d | 0o755}
	want["bin/tool"] = node{Mode: r | 0o755, UID: 1000, GID: 1000, Content: "#!/bin/sh\n"}
	return img, want
}

// tarDir writes dir as a tar (an OCI archive is a tarred layout).
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBuildImageFromOCI(t *testing.T) {
	needTools(t)
	img, want := testImage(t)
	dir := t.TempDir()

	docker := filepath.Join(dir, "docker.tar")
	if err := tarball.WriteToFile(docker, name.MustParseReference("ctld/test:1"), img); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(dir, "layout")
	p, err := layout.Write(lay, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	// A second image for another platform: the builder must pick ours.
	other, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(other, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "s390x"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		t.Fatal(err)
	}
	ociArchive := filepath.Join(dir, "oci.tar")
	tarDir(t, lay, ociArchive)

	for _, c := range []struct {
		path string
		kind Kind
	}{{docker, KindDockerArchive}, {lay, KindOCILayout}, {ociArchive, KindOCIArchive}} {
		t.Run(string(c.kind), func(t *testing.T) {
			if k, err := Detect(c.path); err != nil || k != c.kind {
				t.Fatalf("Detect(%s) = %q, %v; want %q", c.path, k, err, c.kind)
			}
			out, _ := build(t, Source{Path: c.path}, 16<<20)
			fsck(t, out)
			compareTree(t, imageTree(t, out), want)
		})
	}
}

// TestBadSources: each bad input is a clear, typed error and leaves nothing
// next to the image path.
func TestBadSources(t *testing.T) {
	needTools(t)
	img, _ := testImage(t)
	good := mkTar(t, []tent{{h: regH("a", 0o644, 0, 0), content: strings.Repeat("x", 4096)}})
	cases := []struct {
		name string
		kind Kind
		data func(dir string) string // writes the source, returns its path
		size int64
		fs   string
		want error
	}{
		{name: "dotdot", want: ErrUnsafePath, data: tarOf(t, []tent{{h: regH("a/../../x", 0o644, 0, 0), content: "x"}})},
		{name: "absolute", want: ErrUnsafePath, data: tarOf(t, []tent{{h: regH("/etc/x", 0o644, 0, 0), content: "x"}})},
		{name: "absolute symlinked parent", want: ErrUnsafePath, data: tarOf(t, []tent{
			{h: linkH("up", "/")}, {h: regH("up/etc/x", 0o644, 0, 0), content: "x"}})},
		{name: "relative symlinked parent", want: ErrUnsafePath, data: tarOf(t, []tent{
			{h: dirH("d/", 0o755, 0, 0)}, {h: linkH("d/up", "../..")}, {h: regH("d/up/x", 0o644, 0, 0), content: "x"}})},
		{name: "hard link out", want: ErrUnsafePath, data: tarOf(t, []tent{
			{h: tar.Header{Typeflag: tar.TypeLink, Name: "l", Linkname: "../../etc/passwd"}}})},
		{name: "corrupt tar", want: ErrBadSource, data: func(dir string) string {
			p := filepath.Join(dir, "bad.tar")
			os.WriteFile(p, good[:700], 0o644) // a header and half a file
			return p
		}},
		{name: "truncated tar, kind given", kind: KindTar, want: ErrBadSource, data: func(dir string) string {
			p := filepath.Join(dir, "bad.tar")
			os.WriteFile(p, good[:700], 0o644)
			return p
		}},
		{name: "garbage", kind: KindTar, want: ErrBadSource, data: func(dir string) string {
			p := filepath.Join(dir, "bad.tar")
			os.WriteFile(p, bytes.Repeat([]byte("not a tar "), 100), 0o644)
			return p
		}},
		{name: "docker archive without manifest", kind: KindDockerArchive, want: ErrBadSource, data: tarOf(t, []tent{
			{h: regH("repositories", 0o644, 0, 0), content: "{}"}})},
		{name: "oci layout without index", kind: KindOCILayout, want: ErrBadSource, data: func(dir string) string {
			p := filepath.Join(dir, "layout")
			os.MkdirAll(p, 0o755)
			os.WriteFile(filepath.Join(p, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
			return p
		}},
		{name: "docker archive with corrupt layer", want: ErrBadSource, data: func(dir string) string {
			p := filepath.Join(dir, "docker.tar")
			if err := tarball.WriteToFile(p, name.MustParseReference("ctld/test:1"), img); err != nil {
				t.Fatal(err)
			}
			corruptLastLayer(t, p)
			return p
		}},
		{name: "content beyond size", size: 1 << 20, want: ErrImageTooSmall, data: tarOf(t, []tent{
			{h: regH("big", 0o644, 0, 0), content: strings.Repeat("y", 2<<20)}})},
		{name: "metadata beyond size", size: 256 << 10, want: ErrImageTooSmall, data: tarOf(t, []tent{
			{h: regH("fits-alone", 0o644, 0, 0), content: strings.Repeat("y", 200<<10)}})},
		{name: "xfs", fs: "xfs", want: ErrUnsupportedFS, data: tarOf(t, nil)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srcDir, outDir := t.TempDir(), t.TempDir()
			src := c.data(srcDir)
			size := c.size
			if size == 0 {
				size = 16 << 20
			}
			out := filepath.Join(outDir, "root.ext4")
			_, err := BuildImage(t.Context(), Source{Kind: c.kind, Path: src}, out, ImageOptions{Size: size, FSType: c.fs})
			if !errors.Is(err, c.want) {
				t.Fatalf("BuildImage: %v; want %v", err, c.want)
			}
			t.Logf("error: %v", err)
			if left := onlyFiles(t, outDir); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

func tarOf(t *testing.T, es []tent) func(string) string {
	b := mkTar(t, es)
	return func(dir string) string {
		p := filepath.Join(dir, "src.tar")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// corruptLastLayer flips a byte in the middle of the largest member of a
// docker archive (a layer), keeping the archive itself well-formed.
func corruptLastLayer(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var off, size int64
	cr := &countingReader{r: bytes.NewReader(b)}
	tr := tar.NewReader(cr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pos := cr.n
		if strings.HasSuffix(h.Name, ".tar.gz") || strings.HasSuffix(h.Name, ".tar") || strings.Contains(h.Name, "sha256") {
			if h.Size > size {
				off, size = pos, h.Size
			}
		}
	}
	if size == 0 {
		t.Fatal("no layer in the docker archive")
	}
	b[off+size/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
