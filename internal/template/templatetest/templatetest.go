// Package templatetest has the test fixtures of templates that several
// packages' tests share: a block store in a temp dir, a registry on
// loopback behind a password, images of tar layers. It does not import
// package template, so template's own tests can use it.
package templatetest

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
)

// Repo is a block store in a temp dir under a fresh node key.
func Repo(t testing.TB) (blockstore.Store, *blockstore.Repo) {
	t.Helper()
	st, err := dirstore.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	nk, _, err := blockstore.GenerateNodeKey("test")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(st, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st, repo
}

// TarDir is the tree at dir as a tar, every entry owned by root (the
// busybox template's tree, say, as a layer).
func TarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteTarDir(&buf, dir, false); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// WriteTarDir writes TarDir's tar of dir to w, streamed (a Debian rootfs
// is hundreds of MiB); with owners, each entry keeps its file's owner.
func WriteTarDir(w io.Writer, dir string, owners bool) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name, h.Uname, h.Gname = rel, "", ""
		if !owners {
			h.Uid, h.Gid = 0, 0
		}
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tar %s: %w", dir, err)
	}
	return tw.Close()
}

// GzLayer is a gzip layer of a tar's bytes.
func GzLayer(t testing.TB, tarBytes []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image of layers with config cfg for linux on this machine's
// architecture.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry is go-containerregistry's registry over real HTTP on loopback,
// behind basic auth, counting blob GETs and able to misbehave.
type Registry struct {
	Host, User, Pass string

	t        testing.TB
	mu       sync.Mutex
	blobGets map[string]int    // by digest
	cut      map[string]int    // digest: cut this many more GETs of it half-way
	rewrite  map[string]string // manifest digest: serve this other one's bytes
	hold     map[string]held   // digest: GETs of it wait for release
}

type held struct{ reached, release chan struct{} }

// NewRegistry starts a registry, closed at the test's end.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	r := &Registry{t: t, User: "puller", Pass: "s3cret pass", blobGets: map[string]int{}, cut: map[string]int{}, rewrite: map[string]string{}, hold: map[string]held{}}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, p, ok := req.BasicAuth()
		if !ok || u != r.User || p != r.Pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
			return
		}
		if i := strings.Index(req.URL.Path, "/manifests/"); i >= 0 && req.Method == http.MethodGet {
			r.mu.Lock()
			other, ok := r.rewrite[req.URL.Path[i+len("/manifests/"):]]
			r.mu.Unlock()
			if ok {
				req.URL.Path = req.URL.Path[:i] + "/manifests/" + other
			}
		}
		if i := strings.Index(req.URL.Path, "/blobs/sha256:"); i >= 0 && req.Method == http.MethodGet {
			d := req.URL.Path[i+len("/blobs/"):]
			r.mu.Lock()
			r.blobGets[d]++
			cut := r.cut[d] > 0
			if cut {
				r.cut[d]--
			}
			h, hold := r.hold[d]
			r.mu.Unlock()
			if hold {
				select {
				case h.reached <- struct{}{}:
				default:
				}
				select {
				case <-h.release:
				case <-req.Context().Done():
					return
				}
			}
			if cut {
				rec := httptest.NewRecorder()
				inner.ServeHTTP(rec, req)
				body := rec.Body.Bytes()
				w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				w.WriteHeader(rec.Code)
				w.Write(body[:len(body)/2])
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler) // the connection is cut mid-blob
			}
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// Auth is the registry's password as a remote option.
func (r *Registry) Auth() remote.Option {
	return remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Pass})
}

// Push uploads img as repoTag and returns its reference and digest.
func (r *Registry) Push(repoTag string, img v1.Image) (ref string, digest v1.Hash) {
	r.t.Helper()
	ref = r.Host + "/" + repoTag
	tag, err := name.ParseReference(ref)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := remote.Write(tag, img, r.Auth()); err != nil {
		r.t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		r.t.Fatal(err)
	}
	return ref, d
}

// Gets is how many times blob h was asked for.
func (r *Registry) Gets(h v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[h.String()]
}

// TotalGets is how many blob GETs the registry answered.
func (r *Registry) TotalGets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.blobGets {
		n += c
	}
	return n
}

// Cut makes the next n GETs of blob h stop half-way.
func (r *Registry) Cut(h v1.Hash, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut[h.String()] = n
}

// Hold makes GETs of blob h wait until release is called; reached gets a
// value when one is waiting.
func (r *Registry) Hold(h v1.Hash) (reached <-chan struct{}, release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := held{reached: make(chan struct{}, 1), release: make(chan struct{})}
	r.hold[h.String()] = c
	var once sync.Once
	return c.reached, func() { once.Do(func() { close(c.release) }) }
}

// Rewrite serves manifest other's bytes when manifest h is asked for.
func (r *Registry) Rewrite(h, other v1.Hash) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rewrite[h.String()] = other.String()
}

// DockerConfig points DOCKER_CONFIG (what authn.DefaultKeychain reads) at
// a config.json holding the registry's user with password pass.
func (r *Registry) DockerConfig(t testing.TB, pass string) {
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(r.User + ":" + pass))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, r.Host, auth)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}
