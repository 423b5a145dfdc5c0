package template

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// checkedImage is a pulled image whose layers mutate.Extract reads in one
// pass each: decompressed with klauspost/compress (gzip or zstd, by the
// blob's magic, which the pull checked against the media type) and hashed
// on the way against the config's diff ID, checked when the layer's
// reader reaches its end (Extract drains every layer to EOF). Before, each
// layer was decompressed twice: once to verify, once to extract.
type checkedImage struct{ v1.Image }

func (c checkedImage) Layers() ([]v1.Layer, error) {
	ls, err := c.Image.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Layer, len(ls))
	for i, l := range ls {
		out[i] = &checkedLayer{Layer: l, index: i}
	}
	return out, nil
}

type checkedLayer struct {
	v1.Layer
	index int
}

// maxZstdWindow bounds a zstd layer's decoder memory (the format lets a
// frame ask for up to 3.75 TB of window).
const maxZstdWindow = 64 << 20

func (l *checkedLayer) Uncompressed() (io.ReadCloser, error) {
	want, err := l.DiffID()
	if err != nil {
		return nil, fmt.Errorf("layer %d diff ID: %w: %w", l.index, ErrBadSource, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("open layer %d: %w", l.index, err)
	}
	br := bufio.NewReaderSize(rc, 1<<20)
	head, _ := br.Peek(4)
	r := &diffIDReader{want: want, index: l.index, h: sha256.New(), closers: []func() error{rc.Close}}
	switch {
	case bytes.HasPrefix(head, layerMagic[types.DockerLayer]):
		zr, err := gzip.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("layer %d: %w: %w", l.index, ErrBadSource, err)
		}
		zr.Multistream(true)
		r.r = zr
		r.closers = append(r.closers, zr.Close)
	case bytes.HasPrefix(head, layerMagic[types.OCILayerZStd]):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("layer %d: %w: %w", l.index, ErrBadSource, err)
		}
		r.r = zr
		r.closers = append(r.closers, func() error { zr.Close(); return nil })
	default:
		r.r = br
	}
	return r, nil
}

// diffIDReader hashes a layer's uncompressed bytes; at the end it fails
// unless they hash to the diff ID the config names.
type diffIDReader struct {
	r       io.Reader
	h       hash.Hash
	want    v1.Hash
	index   int
	closers []func() error
}

func (d *diffIDReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(d.h.Sum(nil)); d.want.Algorithm != "sha256" || got != d.want.Hex {
			return n, fmt.Errorf("layer %d: content hashes to sha256:%s, config says %s: %w", d.index, got, d.want, ErrBadSource)
		}
	}
	return n, err
}

func (d *diffIDReader) Close() error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i]())
	}
	return errors.Join(errs...)
}
