package blockstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
)

// The benchmarks write and read a 32 MiB device of random (incompressible)
// 64 KiB chunks through the directory store, beside the baseline of the
// same bytes written to (and read from) one plain file with one fsync, in
// the same temp dir and the same run: compare the MB/s columns.
const benchDevice = 32 << 20

func benchData(b *testing.B) []byte {
	data := make([]byte, benchDevice)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	return data
}

func benchRepo(b *testing.B, compress blockstore.Compression) *blockstore.Repo {
	ds, err := dirstore.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	nk, _, _ := blockstore.GenerateNodeKey("node-a")
	r, err := blockstore.New(ds, nk, blockstore.Options{Compression: compress})
	if err != nil {
		b.Fatal(err)
	}
	return r
}

func BenchmarkPlainFileWrite(b *testing.B) {
	data := benchData(b)
	dir := b.TempDir()
	b.SetBytes(benchDevice)
	for i := 0; b.Loop(); i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("dev-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func BenchmarkPlainFileRead(b *testing.B) {
	data := benchData(b)
	p := filepath.Join(b.TempDir(), "dev")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, blockstore.DefaultChunkSize)
	b.SetBytes(benchDevice)
	for b.Loop() {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		for off := int64(0); off < benchDevice; off += int64(len(buf)) {
			if _, err := f.ReadAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
		f.Close()
	}
}

func BenchmarkCommit(b *testing.B) {
	for _, compress := range []blockstore.Compression{blockstore.CompressNone, blockstore.CompressS2, blockstore.CompressZstd} {
		for _, packed := range []bool{false, true} {
			name := string(compress)
			if packed {
				name += "/packed"
			}
			b.Run(name, func(b *testing.B) { benchCommit(b, compress, packed) })
		}
	}
}

// benchCommit commits the bench device, its chunks loose or packed.
func benchCommit(b *testing.B, compress blockstore.Compression, packed bool) {
	data := benchData(b)
	r := benchRepo(b, compress)
	ctx := context.Background()
	cs := blockstore.DefaultChunkSize
	b.SetBytes(benchDevice)
	for i := 0; b.Loop(); i++ {
		// A volume per round: chunks are named by content, so a
		// second round in the same volume would only dedup.
		ref := blockstore.GenRef{Volume: blockstore.Template(fmt.Sprintf("t%d", i)), Generation: 0}
		w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: ref, DeviceSize: benchDevice, Packed: packed})
		if err != nil {
			b.Fatal(err)
		}
		for c := 0; c < benchDevice/cs; c++ {
			if err := w.WriteChunk(ctx, uint64(c), data[c*cs:(c+1)*cs]); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := w.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadChunk(b *testing.B) {
	for _, compress := range []blockstore.Compression{blockstore.CompressNone, blockstore.CompressS2, blockstore.CompressZstd} {
		for _, packed := range []bool{false, true} {
			name := string(compress)
			if packed {
				name += "/packed"
			}
			b.Run(name, func(b *testing.B) { benchReadChunk(b, compress, packed) })
		}
	}
}

// benchReadChunk reads the bench device, its chunks loose or packed.
func benchReadChunk(b *testing.B, compress blockstore.Compression, packed bool) {
	data := benchData(b)
	r := benchRepo(b, compress)
	ctx := context.Background()
	cs := blockstore.DefaultChunkSize
	ref := blockstore.GenRef{Volume: blockstore.Template("t"), Generation: 0}
	chunks := map[uint64][]byte{}
	for c := 0; c < benchDevice/cs; c++ {
		chunks[uint64(c)] = data[c*cs : (c+1)*cs]
	}
	if _, err := r.Commit(ctx, blockstore.CommitSpec{Generation: ref, DeviceSize: benchDevice, Packed: packed}, chunks); err != nil {
		b.Fatal(err)
	}
	im, err := r.Open(ctx, ref)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, cs)
	b.SetBytes(benchDevice)
	for b.Loop() {
		for c := uint64(0); c < im.Chunks(); c++ {
			if err := im.ReadChunk(ctx, c, buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}
