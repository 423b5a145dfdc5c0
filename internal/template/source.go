package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// Kind says how a template source is read.
type Kind string

const (
	KindAuto          Kind = ""               // detect from the path
	KindDir           Kind = "dir"            // a directory tree
	KindTar           Kind = "tar"            // a tarball of a tree, plain or gzip
	KindDockerArchive Kind = "docker-archive" // `docker save` output
	KindOCIArchive    Kind = "oci-archive"    // a tar of an OCI image layout
	KindOCILayout     Kind = "oci"            // an OCI image layout directory
	KindImage         Kind = "image"          // Source.Image, already opened (a registry pull)
)

// Source is where a template's tree comes from.
type Source struct {
	Kind  Kind
	Path  string
	Image v1.Image // KindImage
}

// Detect works out a source's kind: a directory with an oci-layout file is
// an OCI layout, any other directory a tree; a tar holding manifest.json is a
// docker archive, one holding oci-layout an OCI archive, any other tar (or a
// gzip) a tree.
func Detect(p string) (Kind, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("detect source kind: %w", err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(p, "oci-layout")); err == nil {
			return KindOCILayout, nil
		}
		return KindDir, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("detect source kind: %w", err)
	}
	defer f.Close()
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return "", fmt.Errorf("detect kind of %s: %w: %w", p, ErrBadSource, err)
	}
	if magic == [2]byte{0x1f, 0x8b} {
		return KindTar, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tr := tar.NewReader(f)
	kind := KindTar
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return kind, nil
		}
		if err != nil {
			return "", fmt.Errorf("detect kind of %s: %w: %w", p, ErrBadSource, err)
		}
		switch strings.TrimPrefix(h.Name, "./") {
		case "manifest.json":
			return KindDockerArchive, nil
		case "oci-layout":
			kind = KindOCIArchive // keep looking: docker save may hold both
		}
	}
}

// feed reads the source's tree, entry by entry, into u. tmp is a directory
// for scratch files (an OCI archive's layout).
func feed(ctx context.Context, src Source, u *unpacker, tmp string) error {
	kind := src.Kind
	if kind == KindAuto {
		k, err := Detect(src.Path)
		if err != nil {
			return err
		}
		kind = k
	}
	switch kind {
	case KindImage:
		// A registry pull: its layers are blobs of the cache, read once.
		return feedLayers(ctx, checkedImage{src.Image}, u)
	case KindDir:
		return feedDir(ctx, src.Path, u)
	case KindTar:
		f, err := os.Open(src.Path)
		if err != nil {
			return fmt.Errorf("open tarball: %w", err)
		}
		defer f.Close()
		br := bufio.NewReader(f)
		var r io.Reader = br
		if m, _ := br.Peek(2); len(m) == 2 && m[0] == 0x1f && m[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				return fmt.Errorf("read %s: %w: %w", src.Path, ErrBadSource, err)
			}
			defer zr.Close()
			r = zr
		}
		return feedTar(ctx, r, u)
	case KindDockerArchive:
		img, err := tarball.ImageFromPath(src.Path, nil)
		if err != nil {
			return fmt.Errorf("read docker archive %s: %w: %w", src.Path, ErrBadSource, err)
		}
		return feedImage(ctx, img, u)
	case KindOCILayout:
		img, err := layoutImage(src.Path)
		if err != nil {
			return err
		}
		return feedImage(ctx, img, u)
	case KindOCIArchive:
		dir := filepath.Join(tmp, "oci")
		if err := extractLayout(src.Path, dir); err != nil {
			return err
		}
		img, err := layoutImage(dir)
		if err != nil {
			return err
		}
		return feedImage(ctx, img, u)
	default:
		return fmt.Errorf("source kind %q: %w", kind, ErrBadSource)
	}
}

func feedTar(ctx context.Context, r io.Reader, u *unpacker) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w: %w", ErrBadSource, err)
		}
		if err := u.add(h, tr); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) {
				return fmt.Errorf("%w: %w", ErrBadSource, err)
			}
			return err
		}
	}
}

// feedImage flattens an image's layers (whiteouts applied) into u.
func feedImage(ctx context.Context, img v1.Image, u *unpacker) error {
	if err := verifyLayers(ctx, img); err != nil {
		return err
	}
	return feedLayers(ctx, img, u)
}

// feedLayers flattens img's layers into u, trusting them as they are read
// (feedImage verifies them first; checkedImage verifies them as it goes).
func feedLayers(ctx context.Context, img v1.Image, u *unpacker) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := feedTar(ctx, rc, u); err != nil {
		return fmt.Errorf("flatten image: %w", err)
	}
	// Extract ends its tar (the end marker) before it reports why it
	// stopped, so a refused entry (an unsafe path) looks like the end of
	// the image: only the pipe's error after the marker tells.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		if strings.Contains(err.Error(), "unsafe tar path") {
			return fmt.Errorf("flatten image: %w: %w", ErrUnsafePath, err)
		}
		return fmt.Errorf("flatten image: %w: %w", ErrBadSource, err)
	}
	return nil
}

// verifyLayers reads every layer once, uncompressed, and checks it against
// its diff ID in the image config. mutate.Extract alone does not: it stops
// at each tar's end marker, before a gzip trailer's checksum, so a flipped
// byte inside a layer would become a wrong file rather than an error.
func verifyLayers(ctx context.Context, img v1.Image) error {
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("read layers: %w: %w", ErrBadSource, err)
	}
	for i, l := range layers {
		want, err := l.DiffID()
		if err != nil {
			return fmt.Errorf("layer %d diff ID: %w: %w", i, ErrBadSource, err)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("open layer %d: %w: %w", i, ErrBadSource, err)
		}
		got, _, err := v1.SHA256(&ctxReader{ctx: ctx, r: rc})
		rc.Close()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read layer %d (%s): %w: %w", i, want, ErrBadSource, err)
		}
		if got != want {
			return fmt.Errorf("layer %d: content hashes to %s, config says %s: %w", i, got, want, ErrBadSource)
		}
	}
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// layoutImage picks the image of an OCI layout: the only one, or the one for
// this machine's platform.
func layoutImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w: %w", dir, ErrBadSource, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read OCI index of %s: %w: %w", dir, ErrBadSource, err)
	}
	var pick *v1.Descriptor
	for i := range im.Manifests {
		d := &im.Manifests[i]
		if !d.MediaType.IsImage() {
			continue
		}
		if len(im.Manifests) == 1 || d.Platform == nil ||
			(d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH) {
			pick = d
			break
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("OCI layout %s: no image for linux/%s: %w", dir, runtime.GOARCH, ErrBadSource)
	}
	img, err := idx.Image(pick.Digest)
	if err != nil {
		return nil, fmt.Errorf("read image %s of %s: %w: %w", pick.Digest, dir, ErrBadSource, err)
	}
	return img, nil
}

// extractLayout unpacks an OCI archive (a tar of a layout: oci-layout,
// index.json, blobs/...) into dir; only directories and regular files are
// expected, and nothing may leave dir.
func extractLayout(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("open OCI archive: %w", err)
	}
	defer f.Close()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create layout dir: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read OCI archive %s: %w: %w", archive, ErrBadSource, err)
		}
		name, err := cleanName(h.Name)
		if err != nil {
			return fmt.Errorf("OCI archive %s: %w", archive, err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := root.MkdirAll(name, 0o700); err != nil {
					return escapeErr(name, fmt.Errorf("OCI archive: %w", err))
				}
			}
		case tar.TypeReg:
			if d := filepath.Dir(name); d != "." {
				if err := root.MkdirAll(d, 0o700); err != nil {
					return escapeErr(name, fmt.Errorf("OCI archive: %w", err))
				}
			}
			w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return escapeErr(name, fmt.Errorf("OCI archive: %w", err))
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("OCI archive %s: %w: %w", name, ErrBadSource, err)
			}
		default:
			return fmt.Errorf("OCI archive %s: unexpected entry %s of type %q: %w", archive, name, h.Typeflag, ErrBadSource)
		}
	}
}

// feedDir walks a directory tree into u as tar headers: the same checks and
// the same metadata rules as a tarball.
func feedDir(ctx context.Context, dir string, u *unpacker) error {
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walk %s: %w", dir, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			// The directory's own mode and owner are the builder's (often a
			// 0700 temp dir): the image's / is 0755 root:root, so non-root
			// workloads can use it.
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
			u.skipped = append(u.skipped, Skipped{Path: rel, Reason: "device node, fifo or socket"})
			return nil
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return fmt.Errorf("readlink %s: %w", p, err)
			}
		}
		h, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return fmt.Errorf("header of %s: %w", p, err)
		}
		h.Name = rel
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
			if fi.Mode().IsRegular() && st.Nlink > 1 {
				k := inode{st.Dev, st.Ino}
				if first, ok := links[k]; ok {
					h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
				} else {
					links[k] = rel
				}
			}
		}
		if err := dirXattrs(p, h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return u.add(h, nil)
		}
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		defer f.Close()
		return u.add(h, f)
	})
}

// dirXattrs copies a source file's xattrs into its header.
func dirXattrs(p string, h *tar.Header) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil // no xattr support or none: nothing to copy
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		vs, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			continue
		}
		v := make([]byte, vs)
		vs, err = unix.Lgetxattr(p, name, v)
		if err != nil {
			continue
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+name] = string(v[:vs])
	}
	return nil
}
