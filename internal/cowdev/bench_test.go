package cowdev_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
)

// BenchmarkVsFile: nbdcopy through nbdsrv over a cowdev against nbdsrv.File
// on the same data, in the same run (ratios: cowdev throughput / File's).
// Read cold (every chunk fetched from a dirstore, authenticated,
// decrypted, cached), read warm (from the cache), and a write of the
// whole image with --flush (whole chunks: no copy-on-write fetch).
//
//	go test -run '^$' -bench VsFile -benchtime 1x ./internal/cowdev/
func BenchmarkVsFile(b *testing.B) {
	nbdtest.NeedPeers(b, "nbdcopy")
	const size = 256 << 20
	const chunk = blockstore.DefaultChunkSize
	tmp := b.TempDir()
	img := make([]byte, size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < size; i += 8 {
		if (i/chunk)%8 == 7 {
			continue // some zero chunks: holes in the store
		}
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			img[i+j] = byte(v >> (8 * j))
		}
	}
	ref := filepath.Join(tmp, "ref.img")
	if err := os.WriteFile(ref, img, 0o600); err != nil {
		b.Fatal(err)
	}
	f := newFixture(b, 1)
	chunks := map[uint64][]byte{}
	for i := 0; i < size/chunk; i++ {
		chunks[uint64(i)] = img[i*chunk : (i+1)*chunk]
	}
	base := blockstore.GenRef{Volume: blockstore.Template("bench"), Generation: 0}
	if _, err := f.repo.Commit(context.Background(), blockstore.CommitSpec{Generation: base, DeviceSize: size, ChunkSize: chunk}, chunks); err != nil {
		b.Fatal(err)
	}
	img, chunks = nil, nil

	copyTime := func(args ...string) time.Duration {
		start := time.Now()
		out, err := exec.Command("nbdcopy", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("nbdcopy %v: %v\n%s", args, err, out)
		}
		return time.Since(start)
	}
	newDev := func() *cowdev.Device {
		d, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: base, Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.Close() })
		return d
	}
	file, err := nbdsrv.OpenFile(ref, false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = file.Close() })
	fileURI := serve(b, file)
	_ = copyTime(fileURI, "null:") // page cache warm for the reference
	b.ResetTimer()
	var cold, warm, write float64
	for n := 0; n < b.N; n++ {
		tFile := copyTime(fileURI, "null:")
		devURI := serve(b, newDev())
		tCold := copyTime(devURI, "null:")
		tWarm := copyTime(devURI, "null:")
		target := filepath.Join(b.TempDir(), "w.img")
		if err := os.WriteFile(target, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(target, size); err != nil {
			b.Fatal(err)
		}
		wf, err := nbdsrv.OpenFile(target, false)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = wf.Close() })
		tFileW := copyTime("--flush", ref, serve(b, wf))
		tDevW := copyTime("--flush", ref, serve(b, newDev()))
		cold, warm, write = tFile.Seconds()/tCold.Seconds(), tFile.Seconds()/tWarm.Seconds(), tFileW.Seconds()/tDevW.Seconds()
		b.Logf("256 MiB: File read %v, cowdev cold %v warm %v; File write %v, cowdev write %v", tFile, tCold, tWarm, tFileW, tDevW)
	}
	b.ReportMetric(cold, "cold-read-ratio")
	b.ReportMetric(warm, "warm-read-ratio")
	b.ReportMetric(write, "write-ratio")
}
