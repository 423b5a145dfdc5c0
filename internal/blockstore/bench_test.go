package blockstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

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
	return benchRepoWith(b, blockstore.Options{Compression: compress})
}

func benchRepoWith(b *testing.B, opts blockstore.Options) *blockstore.Repo {
	ds, err := dirstore.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	nk, _, _ := blockstore.GenerateNodeKey("node-a")
	r, err := blockstore.New(ds, nk, opts)
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
	b.SetBytes(benchDevice)
	for i := 0; b.Loop(); i++ {
		commitDevice(b, r, fmt.Sprintf("t%d", i), data, packed)
	}
}

// commitDevice commits data as generation 0 of template name (a volume
// per round: chunks are named by content, so a second round in the same
// volume would only dedup).
func commitDevice(b *testing.B, r *blockstore.Repo, name string, data []byte, packed bool) {
	ctx := context.Background()
	cs := blockstore.DefaultChunkSize
	ref := blockstore.GenRef{Volume: blockstore.Template(name), Generation: 0}
	w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: ref, DeviceSize: uint64(len(data)), Packed: packed})
	if err != nil {
		b.Fatal(err)
	}
	for c := 0; c < len(data)/cs; c++ {
		if err := w.WriteChunk(ctx, uint64(c), data[c*cs:(c+1)*cs]); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := w.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPackedSealers: a packed commit of the bench device (S2, as a
// template import stores it) with one sealer against GOMAXPROCS sealers,
// alternating in one run; reports the ratio parallel/one.
func BenchmarkPackedSealers(b *testing.B) {
	data := benchData(b)
	one := benchRepoWith(b, blockstore.Options{Compression: blockstore.CompressS2, Sealers: 1})
	all := benchRepoWith(b, blockstore.Options{Compression: blockstore.CompressS2})
	var tOne, tAll time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		commitDevice(b, one, fmt.Sprintf("t%d", i), data, true)
		t1 := time.Now()
		commitDevice(b, all, fmt.Sprintf("t%d", i), data, true)
		tOne, tAll = tOne+t1.Sub(t0), tAll+time.Since(t1)
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64(tAll)/float64(tOne), "parallel/one")
	fmt.Printf("packed commit of %d MiB: one sealer %v, %d sealers %v: ratio %.2f\n", benchDevice>>20,
		(tOne / n).Round(time.Millisecond), runtime.GOMAXPROCS(0), (tAll / n).Round(time.Millisecond), float64(tAll)/float64(tOne))
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
