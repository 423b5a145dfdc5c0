package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

// PullOptions says how an image is pulled from a registry.
type PullOptions struct {
	// Keychain finds credentials per registry; nil is
	// authn.DefaultKeychain (the docker config file, $DOCKER_CONFIG, and
	// its credential helpers).
	Keychain authn.Keychain
	// Transport is the HTTP transport; nil is remote.DefaultTransport.
	Transport http.RoundTripper
	// Platform picks the image of a multi-platform index; the zero value
	// is linux on this machine's architecture.
	Platform v1.Platform
	// CacheDir holds layers by digest (blobs/sha256/<hex>), shared by
	// every pull: a layer it has is never downloaded again.
	CacheDir string
	// MaxLayers (default 128) and MaxBytes (the layers' compressed sizes
	// together; default 8 GiB) bound what an image may ask for, before
	// anything is downloaded.
	MaxLayers int
	MaxBytes  int64
	// Attempts per layer download (default 3): a connection cut mid-blob
	// is downloaded again, from the start.
	Attempts int
	Progress func(PullProgress)
}

// PullProgress is reported as layers download.
type PullProgress struct {
	Layers, LayersDone int   // layers of the image; done = cached or downloaded
	Bytes, BytesDone   int64 // compressed bytes of the layers
	Cached             int   // layers the cache had
	Started            time.Time
}

// Pulled is an image pulled into the layer cache.
type Pulled struct {
	Image       v1.Image // reads its layers from the cache
	Ref         string   // as given
	Digest      v1.Hash  // the image manifest's digest
	IndexDigest v1.Hash  // the index's, when Ref named a multi-platform index
	Platform    v1.Platform
	// Added are the cache files this pull made (Discard removes them).
	Added      []string
	Downloaded int64 // bytes downloaded (layers not in the cache)
}

// Discard removes the layers this pull added to the cache: an image whose
// content was refused leaves nothing behind.
func (p *Pulled) Discard() {
	for _, f := range p.Added {
		os.Remove(f)
	}
	p.Added = nil
}

const (
	defaultMaxLayers = 128
	defaultMaxBytes  = 8 << 30
	maxConfigBytes   = 4 << 20
)

// layerMagic says what a layer of each accepted media type must start
// with: a blob whose bytes say otherwise is refused (the library would
// silently read a "gzip" layer that is not gzip as a plain tar).
var layerMagic = map[types.MediaType][]byte{
	types.DockerLayer:             {0x1f, 0x8b},
	types.OCILayer:                {0x1f, 0x8b},
	types.OCILayerZStd:            {0x28, 0xb5, 0x2f, 0xfd},
	types.DockerUncompressedLayer: nil,
	types.OCIUncompressedLayer:    nil,
}

// PullImage resolves ref (a tag or a digest: a digest is verified, a
// manifest that does not hash to it is refused) to one image manifest (an
// index: the entry for o.Platform), and brings its layers into the cache.
func PullImage(ctx context.Context, ref string, o PullOptions) (*Pulled, error) {
	r, err := resolveImage(ctx, ref, o)
	if err != nil {
		return nil, err
	}
	return r.pull(ctx)
}

// resolved is an image whose manifest and config are fetched and
// checked, its layers not yet.
type resolved struct {
	o           PullOptions // defaults filled in
	p           *Pulled     // without Image
	img         v1.Image    // the registry's
	m           *v1.Manifest
	rawManifest []byte
	rawConfig   []byte
	mediaType   types.MediaType
}

// resolveImage fetches and checks ref's manifest (an index: the entry for
// o.Platform) and config; no layer is downloaded.
func resolveImage(ctx context.Context, ref string, o PullOptions) (*resolved, error) {
	if o.CacheDir == "" {
		return nil, errors.New("pull image: no layer cache directory")
	}
	if o.Keychain == nil {
		o.Keychain = authn.DefaultKeychain
	}
	if o.Transport == nil {
		o.Transport = remote.DefaultTransport
	}
	if o.Platform.OS == "" {
		o.Platform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	o.MaxLayers = cmpPositive(o.MaxLayers, defaultMaxLayers)
	o.MaxBytes = cmpPositive(o.MaxBytes, defaultMaxBytes)
	o.Attempts = cmpPositive(o.Attempts, 3)
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w: %w", ref, ErrBadSource, err)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(o.Keychain), remote.WithTransport(o.Transport)}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	p := &Pulled{Ref: ref, Platform: o.Platform}
	switch {
	case desc.MediaType.IsIndex():
		p.IndexDigest = desc.Digest
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w: %w", ref, ErrBadSource, err)
		}
		d, err := pickPlatform(idx, o.Platform)
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, err)
		}
		// Fetched by digest: the child manifest is verified against it.
		child, err := remote.Get(r.Context().Digest(d.Digest.String()), opts...)
		if err != nil {
			return nil, fmt.Errorf("pull %s: image %s for %s: %w", ref, d.Digest, o.Platform, err)
		}
		if !child.MediaType.IsImage() {
			return nil, fmt.Errorf("pull %s: entry %s for %s is a %s, not an image manifest: %w", ref, d.Digest, o.Platform, child.MediaType, ErrBadSource)
		}
		desc = child
	case desc.MediaType.IsImage():
	default:
		return nil, fmt.Errorf("pull %s: manifest of media type %q is not an image or an index: %w", ref, desc.MediaType, ErrBadSource)
	}
	if desc.MediaType.IsSchema1() {
		return nil, fmt.Errorf("pull %s: schema 1 manifests are not supported: %w", ref, ErrBadSource)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w: %w", ref, ErrBadSource, err)
	}
	p.Digest = desc.Digest
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w: %w", ref, ErrBadSource, err)
	}
	if err := checkManifest(m, o); err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	rawConfig, err := img.RawConfigFile() // verified against its digest
	if err != nil {
		return nil, fmt.Errorf("pull %s: config: %w", ref, err)
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	return &resolved{o: o, p: p, img: img, m: m, rawManifest: rawManifest, rawConfig: rawConfig, mediaType: desc.MediaType}, nil
}

// pull brings the layers into the cache: the Pulled image reads them
// from there.
func (r *resolved) pull(ctx context.Context) (*Pulled, error) {
	p := r.p
	if err := pullLayers(ctx, r.img, r.m, r.o, p); err != nil {
		if errors.Is(err, ErrBadSource) {
			p.Discard() // refused for its content: nothing of it stays
		}
		return nil, fmt.Errorf("pull %s: %w", p.Ref, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(r.rawConfig))
	if err == nil && len(cf.RootFS.DiffIDs) != len(r.m.Layers) {
		err = fmt.Errorf("config names %d diff IDs for %d layers", len(cf.RootFS.DiffIDs), len(r.m.Layers))
	}
	if err != nil {
		p.Discard()
		return nil, fmt.Errorf("pull %s: config: %w: %w", p.Ref, ErrBadSource, err)
	}
	cached, err := partial.CompressedToImage(&cachedImage{dir: r.o.CacheDir, manifest: r.rawManifest, config: r.rawConfig, mediaType: r.mediaType, layers: r.m.Layers, diffIDs: cf.RootFS.DiffIDs})
	if err != nil {
		p.Discard()
		return nil, fmt.Errorf("pull %s: %w", p.Ref, err)
	}
	p.Image = cached
	return p, nil
}

// reportCached reports every layer as not downloaded: the image they make
// is stored already.
func (r *resolved) reportCached() {
	if r.o.Progress == nil {
		return
	}
	pr := PullProgress{Layers: len(r.m.Layers), LayersDone: len(r.m.Layers), Cached: len(r.m.Layers), Started: time.Now()}
	for _, l := range r.m.Layers {
		pr.Bytes += l.Size
	}
	pr.BytesDone = pr.Bytes
	r.o.Progress(pr)
}

func cmpPositive[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// pickPlatform is the index entry for p: an image manifest of the same OS
// and architecture (and variant, when p names one).
func pickPlatform(idx v1.ImageIndex, p v1.Platform) (v1.Descriptor, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("read index: %w: %w", ErrBadSource, err)
	}
	var seen []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			continue
		}
		seen = append(seen, d.Platform.String())
		if d.Platform.OS == p.OS && d.Platform.Architecture == p.Architecture && (p.Variant == "" || d.Platform.Variant == p.Variant) {
			return d, nil
		}
	}
	return v1.Descriptor{}, fmt.Errorf("index has no image for %s (it has %v): %w", p, seen, ErrBadSource)
}

// checkManifest bounds what the manifest asks for before anything is
// downloaded.
func checkManifest(m *v1.Manifest, o PullOptions) error {
	if len(m.Layers) == 0 {
		return fmt.Errorf("image has no layers: %w", ErrBadSource)
	}
	if len(m.Layers) > o.MaxLayers {
		return fmt.Errorf("image has %d layers, at most %d: %w", len(m.Layers), o.MaxLayers, ErrBadSource)
	}
	if m.Config.Size <= 0 || m.Config.Size > maxConfigBytes {
		return fmt.Errorf("image config of %d bytes (at most %d): %w", m.Config.Size, maxConfigBytes, ErrBadSource)
	}
	var total int64
	for i, l := range m.Layers {
		if _, ok := layerMagic[l.MediaType]; !ok {
			return fmt.Errorf("layer %d (%s) has media type %q, not a tar layer this importer reads: %w", i, l.Digest, l.MediaType, ErrBadSource)
		}
		if len(l.URLs) > 0 {
			return fmt.Errorf("layer %d (%s) is a foreign layer (URLs): %w", i, l.Digest, ErrBadSource)
		}
		if l.Digest.Algorithm != "sha256" || l.Size <= 0 {
			return fmt.Errorf("layer %d: digest %s, size %d: %w", i, l.Digest, l.Size, ErrBadSource)
		}
		total += l.Size
		if l.Size > o.MaxBytes || total > o.MaxBytes {
			return fmt.Errorf("layers of more than %d bytes: %w", o.MaxBytes, ErrBadSource)
		}
	}
	return nil
}

func (o PullOptions) blobPath(h v1.Hash) string {
	return filepath.Join(o.CacheDir, "blobs", h.Algorithm, h.Hex)
}

// pullParallel bounds the layers one pull downloads at once.
const pullParallel = 4

// pullLayers downloads the layers the cache does not have, up to
// pullParallel at a time. A layer downloaded stays in the cache even if
// another one fails (only content refused as bad stops the others), so
// the next pull starts from there; p.Added lists them for Discard.
func pullLayers(ctx context.Context, img v1.Image, m *v1.Manifest, o PullOptions, p *Pulled) error {
	if err := os.MkdirAll(filepath.Join(o.CacheDir, "blobs", "sha256"), 0o700); err != nil {
		return fmt.Errorf("create layer cache: %w", err)
	}
	var mu sync.Mutex // guards pr, done, p and the reports
	pr := PullProgress{Layers: len(m.Layers), Started: time.Now()}
	for _, l := range m.Layers {
		pr.Bytes += l.Size
	}
	report := func() {
		if o.Progress != nil {
			o.Progress(pr)
		}
	}
	report()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(m.Layers))
	var g errgroup.Group
	g.SetLimit(pullParallel)
	for i, d := range m.Layers {
		if o.cached(d) {
			mu.Lock()
			pr.LayersDone++
			pr.Cached++
			pr.BytesDone += d.Size
			report()
			mu.Unlock()
			continue
		}
		g.Go(func() error {
			errs[i] = o.fetchLayer(ctx, img, i, d, func(delta int64, finished bool) {
				mu.Lock()
				defer mu.Unlock()
				pr.BytesDone += delta
				if finished {
					pr.LayersDone++
					p.Added = append(p.Added, o.blobPath(d.Digest))
					p.Downloaded += d.Size
				}
				report()
			})
			if errors.Is(errs[i], ErrBadSource) {
				cancel() // the image is refused: the others are waste
			}
			return nil
		})
	}
	g.Wait()
	var bad error
	for _, err := range errs {
		if errors.Is(err, ErrBadSource) {
			return err
		}
		if err != nil && bad == nil {
			bad = err
		}
	}
	return bad
}

// fetchLayer downloads layer i (descriptor d) into the cache, trying
// o.Attempts times; progress gets the bytes as they come (taken back when
// an attempt fails) and finished once the blob is stored.
func (o PullOptions) fetchLayer(ctx context.Context, img v1.Image, i int, d v1.Descriptor, progress func(delta int64, finished bool)) error {
	l, err := img.LayerByDigest(d.Digest)
	if err != nil {
		return fmt.Errorf("layer %d: %w", i, err)
	}
	for attempt := 1; ; attempt++ {
		var got int64
		err = o.download(ctx, l, d, func(n int64) { progress(n-got, false); got = n })
		if err == nil {
			progress(d.Size-got, true)
			return nil
		}
		progress(-got, false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrBadSource) || attempt >= o.Attempts {
			return fmt.Errorf("layer %d (%s): %w", i, d.Digest, err)
		}
	}
}

// cached reports whether the cache has layer d whole: its size and its
// sha256 (a local read, cheap next to a download); a file that does not
// match is removed and downloaded again.
func (o PullOptions) cached(d v1.Descriptor) bool {
	f, err := os.Open(o.blobPath(d.Digest))
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err == nil && n == d.Size && hex.EncodeToString(h.Sum(nil)) == d.Digest.Hex {
		return true
	}
	os.Remove(f.Name())
	return false
}

// download writes one layer blob into the cache: a temp file, checked
// (media type's magic, size, sha256), then renamed to its digest.
func (o PullOptions) download(ctx context.Context, l v1.Layer, d v1.Descriptor, progress func(int64)) error {
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	dir := filepath.Dir(o.blobPath(d.Digest))
	f, err := os.CreateTemp(dir, ".partial-")
	if err != nil {
		return fmt.Errorf("create cache file: %w", err)
	}
	defer os.Remove(f.Name()) // no-op after the rename
	defer f.Close()
	h := sha256.New()
	magic := layerMagic[d.MediaType]
	head := make([]byte, 0, 4)
	var n int64
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		k, rerr := rc.Read(buf)
		if k > 0 {
			if n+int64(k) > d.Size {
				return fmt.Errorf("blob is larger than the manifest's %d bytes: %w", d.Size, ErrBadSource)
			}
			if len(head) < cap(head) {
				head = append(head, buf[:min(k, cap(head)-len(head))]...)
			}
			h.Write(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				return fmt.Errorf("write cache file: %w", err)
			}
			n += int64(k)
			progress(n)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read blob after %d bytes: %w", n, rerr)
		}
	}
	if len(magic) > 0 && !bytes.HasPrefix(head, magic) {
		return fmt.Errorf("layer of media type %s does not start with its magic (% x): %w", d.MediaType, head, ErrBadSource)
	}
	if n != d.Size {
		return fmt.Errorf("blob of %d bytes, the manifest says %d", n, d.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Digest.Hex {
		return fmt.Errorf("blob hashes to sha256:%s, not %s", got, d.Digest)
	}
	// No fsync: a blob is hashed again whenever a pull finds it (cached),
	// so one a crash left torn is downloaded again, never used.
	if err := f.Close(); err != nil {
		return fmt.Errorf("close cache file: %w", err)
	}
	if err := os.Rename(f.Name(), o.blobPath(d.Digest)); err != nil {
		return fmt.Errorf("store layer in cache: %w", err)
	}
	return nil
}

// cachedImage is a pulled image whose layers are read from the cache
// (the manifest and config as the registry served them, verified).
type cachedImage struct {
	dir       string
	manifest  []byte
	config    []byte
	mediaType types.MediaType
	layers    []v1.Descriptor
	diffIDs   []v1.Hash // the config's, one per layer
}

func (c *cachedImage) RawConfigFile() ([]byte, error)      { return c.config, nil }
func (c *cachedImage) MediaType() (types.MediaType, error) { return c.mediaType, nil }
func (c *cachedImage) RawManifest() ([]byte, error)        { return c.manifest, nil }
func (c *cachedImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for i, d := range c.layers {
		if d.Digest == h {
			return &cachedLayer{path: PullOptions{CacheDir: c.dir}.blobPath(h), d: d, diffID: c.diffIDs[i]}, nil
		}
	}
	return nil, fmt.Errorf("layer %s is not in the manifest: %w", h, ErrBadSource)
}

type cachedLayer struct {
	path   string
	d      v1.Descriptor
	diffID v1.Hash
}

// DiffID is the config's: what the layer's content must hash to (without
// it, the library would compute it by decompressing the whole layer, and
// a check against it would check nothing).
func (l *cachedLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }

func (l *cachedLayer) Digest() (v1.Hash, error)            { return l.d.Digest, nil }
func (l *cachedLayer) Size() (int64, error)                { return l.d.Size, nil }
func (l *cachedLayer) MediaType() (types.MediaType, error) { return l.d.MediaType, nil }
func (l *cachedLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("open cached layer: %w", err)
	}
	return f, nil
}
