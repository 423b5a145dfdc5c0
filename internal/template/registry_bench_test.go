package template

import (
	"crypto/rand"
	"fmt"
	"testing"
	"time"
)

// BenchmarkRegistryImportShared: the import of an image (busybox and 32
// MiB of incompressible data, from a registry on loopback, empty layer
// cache) against a second template of the same layers (another config):
// the second downloads no layer; the ext4 build and the store's upload it
// still does. Reports both and their ratio.
func BenchmarkRegistryImportShared(b *testing.B) {
	needTools(b)
	reg := newTestRegistry(b)
	data := make([]byte, 32<<20)
	rand.Read(data)
	big := gzLayer(b, mkTar(b, []tent{{h: regH("data/blob", 0o644, 0, 0), content: string(data)}}))
	bb, app := busyboxLayer(b), appLayer(b)
	cfg2 := appConfig
	cfg2.Env = []string{"SECOND=1"}
	ref1, _ := reg.push("bench/a:v1", imageOf(b, appConfig, bb, app, big))
	ref2, _ := reg.push("bench/b:v1", imageOf(b, cfg2, bb, app, big))
	reg.dockerConfig(b, reg.pass)
	var first, second, pullCold, pullWarm time.Duration
	b.ResetTimer()
	for range b.N {
		_, repo := testRepo(b)
		cache, work := b.TempDir(), b.TempDir()
		t0 := time.Now()
		if _, _, _, err := ImportImage(b.Context(), repo, "a", ref1, PullOptions{CacheDir: cache}, ImageOptions{Size: 128 << 20}, work); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		before := reg.totalGets()
		if _, _, _, err := ImportImage(b.Context(), repo, "b", ref2, PullOptions{CacheDir: cache}, ImageOptions{Size: 128 << 20}, work); err != nil {
			b.Fatal(err)
		}
		first, second = first+t1.Sub(t0), second+time.Since(t1)
		if n := reg.totalGets() - before; n != 1 {
			b.Fatalf("second import made %d blob GETs, want 1 (its config)", n)
		}
		// The pull alone: into an empty cache, then from the warm one.
		cold := b.TempDir()
		t2 := time.Now()
		if _, err := PullImage(b.Context(), ref1, PullOptions{CacheDir: cold}); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if _, err := PullImage(b.Context(), ref2, PullOptions{CacheDir: cold}); err != nil {
			b.Fatal(err)
		}
		pullCold, pullWarm = pullCold+t3.Sub(t2), pullWarm+time.Since(t3)
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64(first/n)/1e6, "first-ms")
	b.ReportMetric(float64(second/n)/1e6, "shared-ms")
	b.ReportMetric(float64(second)/float64(first), "shared/first")
	b.ReportMetric(float64(pullWarm)/float64(pullCold), "pull-warm/cold")
	fmt.Printf("first import %v, second sharing every layer %v: ratio %.2f; the pull alone: %v cold, %v from the cache: ratio %.2f\n",
		(first / n).Round(time.Millisecond), (second / n).Round(time.Millisecond), float64(second)/float64(first),
		(pullCold / n).Round(time.Millisecond), (pullWarm / n).Round(time.Millisecond), float64(pullWarm)/float64(pullCold))
}
