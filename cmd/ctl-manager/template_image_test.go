package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// loopRegistry is a registry on loopback behind a password, with
// DOCKER_CONFIG pointing at a config file that has it.
type loopRegistry struct{ *templatetest.Registry }

func startLoopRegistry(t *testing.T) *loopRegistry {
	t.Helper()
	r := templatetest.NewRegistry(t)
	r.DockerConfig(t, r.Pass)
	return &loopRegistry{r}
}

// push uploads an image of the given tar layers and config as repoTag.
func (r *loopRegistry) push(t *testing.T, repoTag string, cfg v1.Config, layers ...[]byte) (string, v1.Hash) {
	t.Helper()
	var ls []v1.Layer
	for _, b := range layers {
		ls = append(ls, templatetest.GzLayer(t, b))
	}
	return r.Push(repoTag, templatetest.Image(t, cfg, ls...))
}

type tfile struct {
	name, body string
	mode       int64
	dir        bool
	uid, gid   int
}

func tarOfFiles(t *testing.T, fs ...tfile) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range fs {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Uid: f.uid, Gid: f.gid, ModTime: time.Unix(1700000000, 0)}
		if f.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, f.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestCLITemplateImage: `template import NAME --image REF` pulls with the
// docker config's password, prints plain progress lines (stderr is not a
// terminal), records the digest (ls, --json); a second template of the
// same layers downloads none; a missing password is refused, nothing made.
func TestCLITemplateImage(t *testing.T) {
	for _, b := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s not installed (e2fsprogs): %v", b, err)
		}
	}
	reg := startLoopRegistry(t)
	layer := tarOfFiles(t, tfile{name: "etc/", dir: true, mode: 0o755},
		tfile{name: "etc/passwd", body: "root:x:0:0::/:/bin/sh\nweb:x:33:33::/srv:/bin/sh\n", mode: 0o644},
		tfile{name: "etc/motd", body: "hello", mode: 0o644})
	ref, digest := reg.push(t, "web:1", v1.Config{User: "web", WorkingDir: "/srv", Cmd: []string{"/bin/sh"}}, layer)
	ref2, _ := reg.push(t, "web:2", v1.Config{User: "0"}, layer)

	dir := t.TempDir()
	flags := []string{"--store", filepath.Join(dir, "store"), "--node-key", filepath.Join(dir, "node.key")}
	tmpl := func(args ...string) result {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(append([]string{"template"}, args...), flags...), strings.NewReader(""), &out, &errb, func(string) string { return "" })
		return result{code, out.String(), errb.String()}
	}
	if r := tmpl("import", "web", ref, "--image", ref); r.code != exitUsage {
		t.Errorf("import with SOURCE and --image: exit %d\n%s", r.code, r.stderr)
	}
	r := tmpl("import", "web", "--image", ref, "--size", "16Mi")
	if r.code != 0 {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("import:\n%s%s", r.stdout, r.stderr)
	if !strings.Contains(r.stdout, fmt.Sprintf("template web: image %s (%s, linux/%s)", ref, digest, runtime.GOARCH)) ||
		!strings.Contains(r.stderr, "pull: layers 0/1 (0 cached)") || !strings.Contains(r.stderr, "pull: layers 1/1 (0 cached)") || strings.Contains(r.stderr, "\r") {
		t.Errorf("import output:\nstdout: %s\nstderr: %s", r.stdout, r.stderr)
	}
	r = tmpl("--json", "import", "web2", "--image", ref2, "--size", "16Mi")
	var got struct {
		Image template.Meta `json:"image"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got.Image.Config.User != "0" || !strings.Contains(r.stderr, "pull: layers 1/1 (1 cached)") {
		t.Errorf("second import (shared layer): exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(got.Image.Image, "img-") {
		t.Errorf("second import is not a fork of the stored image of its layers:\n%s", r.stdout)
	}
	if r := tmpl("ls"); r.code != 0 || !strings.Contains(r.stdout, "IMAGE") || !strings.Contains(r.stdout, ref+"@"+digest.String()) || strings.Contains(r.stdout, "img-") {
		t.Errorf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no credentials
	if r := tmpl("import", "web3", "--image", ref, "--size", "16Mi"); r.code != exitFailed || !strings.Contains(r.stderr, "UNAUTHORIZED") {
		t.Errorf("import without the password: exit %d\n%s", r.code, r.stderr)
	}
	if r := tmpl("--json", "ls"); !strings.Contains(r.stdout, `"Name": "web2"`) || strings.Contains(r.stdout, "web3") {
		t.Errorf("ls after the refused import:\n%s", r.stdout)
	}
	// prune: the shared layer stays while web2 uses it, then goes.
	if r := tmpl("prune"); r.code != 0 || r.stdout != "pruned 0 layers (0), kept 1\n" {
		t.Errorf("prune: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	tmpl("rm", "web")
	tmpl("rm", "web2")
	if r := tmpl("prune"); r.code != 0 || !strings.HasPrefix(r.stdout, "pruned 1 layers (") || !strings.HasSuffix(r.stdout, "kept 0\nremoved 1 stored images of layers no template uses\n") {
		t.Errorf("prune after rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// The bar and the lines carry bytes, layers and an ETA.
func TestPullProgressFormat(t *testing.T) {
	start := time.Unix(1000, 0)
	p := template.PullProgress{Layers: 3, LayersDone: 1, Cached: 1, Bytes: 40 << 20, BytesDone: 10 << 20, Started: start}
	if got, want := pullLine(p, start.Add(2*time.Second)), "pull: layers 1/3 (1 cached), 10Mi of 40Mi, ETA 6s"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	if got, want := pullBar(p, start.Add(2*time.Second), 8), "[==      ] layers 1/3 (1 cached), 10Mi of 40Mi, ETA 6s"; got != want {
		t.Errorf("bar %q, want %q", got, want)
	}
	p.BytesDone, p.LayersDone = p.Bytes, 3
	if got, want := pullBar(p, start.Add(time.Second), 4), "[====] layers 3/3 (1 cached), 40Mi of 40Mi"; got != want {
		t.Errorf("bar %q, want %q", got, want)
	}
}

// TestCLICreateImageDefaults: claims of a template imported from an image
// carry only what create was told (ctld fills the rest from the image's
// config: cmd/ctld's TestBlockTemplatesDefaults, the VM's
// TestKernelImageConfig), so ctl-manager never reads the node key for
// them; --user 0 says root is the claim's choice (user_set); the import
// keeps the overlay tree in ctld's templates directory; rm removes both.
func TestCLICreateImageDefaults(t *testing.T) {
	for _, b := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s not installed (e2fsprogs): %v", b, err)
		}
	}
	reg := startLoopRegistry(t)
	layer := tarOfFiles(t, tfile{name: "etc/", dir: true, mode: 0o755},
		tfile{name: "etc/passwd", body: "root:x:0:0::/:/bin/sh\nweb:x:33:34::/srv:/bin/sh\n", mode: 0o644})
	ref, _ := reg.push(t, "web:1", v1.Config{User: "web", WorkingDir: "/srv", Entrypoint: []string{"/entry"}, Cmd: []string{"serve"}, Env: []string{"PATH=/bin", "MODE=prod"}}, layer)
	e := newEnv(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ctld.toml")
	if err := os.WriteFile(cfg, []byte("state-dir = \""+dir+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "templates"), 0o755); err != nil { // ctld's, beside its store
		t.Fatal(err)
	}
	e.ok("template", "import", "web", "--image", ref, "--size", "16Mi", "--config", cfg)
	if fi, err := os.Stat(filepath.Join(dir, "templates", "web", "etc", "passwd")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("overlay tree of web: %v %v", fi, err)
	}
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "motd"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.ok("template", "import", "tree", tree, "--size", "16Mi", "--config", cfg)

	var got []api.Process
	e.node.Lock()
	e.node.FailClaim = func(r api.ClaimRequest) error { got = append(got, r.Process); return nil }
	e.node.Unlock()
	e.ok("--config", cfg, "sandbox", "create", "a", "--mode", "block", "--template", "web")
	e.ok("--config", cfg, "sandbox", "create", "b", "--mode", "block", "--template", "web", "--user", "0", "--cwd", "/tmp", "--env", "MODE=dev", "--", "/bin/sh", "-c", "true")
	e.ok("--config", cfg, "sandbox", "create", "c", "--mode", "block", "--template", "tree")
	e.ok("--config", cfg, "sandbox", "create", "d", "--template", "web")
	want := []api.Process{
		{},
		{Args: []string{"/bin/sh", "-c", "true"}, Env: []string{"MODE=dev"}, Cwd: "/tmp", UserSet: true},
		{},
		{},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claims' processes:\n%+v\nwant\n%+v", got, want)
	}
	for _, name := range []string{"web", "tree"} {
		e.ok("--config", cfg, "template", "rm", name)
		if _, err := os.Stat(filepath.Join(dir, "templates", name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("overlay tree of %s after rm: %v", name, err)
		}
	}
}
