package template

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/ctld/ctld/internal/template/templatetest"
)

// BenchmarkRegistryImportShared: the import of an image (busybox and 32
// MiB of incompressible data, from a registry on loopback, empty layer
// cache) against a second template of the same layers (another config):
// the second downloads no layer; the ext4 build and the store's upload it
// still does. Reports both and their ratio.
func BenchmarkRegistryImportShared(b *testing.B) {
	needTools(b)
	reg := templatetest.NewRegistry(b)
	data := make([]byte, 32<<20)
	rand.Read(data)
	big := templatetest.GzLayer(b, mkTar(b, []tent{{h: regH("data/blob", 0o644, 0, 0), content: string(data)}}))
	bb, app := busyboxLayer(b), appLayer(b)
	cfg2 := appConfig
	cfg2.Env = []string{"SECOND=1"}
	ref1, _ := reg.Push("bench/a:v1", templatetest.Image(b, appConfig, bb, app, big))
	ref2, _ := reg.Push("bench/b:v1", templatetest.Image(b, cfg2, bb, app, big))
	reg.DockerConfig(b, reg.Pass)
	var first, second, pullCold, pullWarm time.Duration
	b.ResetTimer()
	for range b.N {
		_, repo := templatetest.Repo(b)
		cache, work := b.TempDir(), b.TempDir()
		t0 := time.Now()
		if _, _, _, err := ImportImage(b.Context(), repo, "a", ref1, PullOptions{CacheDir: cache}, ImageOptions{Size: 128 << 20}, work); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		before := reg.TotalGets()
		if _, _, _, err := ImportImage(b.Context(), repo, "b", ref2, PullOptions{CacheDir: cache}, ImageOptions{Size: 128 << 20}, work); err != nil {
			b.Fatal(err)
		}
		first, second = first+t1.Sub(t0), second+time.Since(t1)
		if n := reg.TotalGets() - before; n != 1 {
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

// BenchmarkRegistryImportVsCrane: the import of an image (pull, unpack,
// ext4 build, store) against what a person would do by hand with the
// same library: crane's pull of the image, its flattened tar untarred into
// a directory by tar(1), then `mkfs.ext4 -d` of that directory at the same
// size (nothing stored). Reports the ratio.
func BenchmarkRegistryImportVsCrane(b *testing.B) {
	needTools(b)
	reg := templatetest.NewRegistry(b)
	data := make([]byte, 32<<20)
	rand.Read(data)
	big := templatetest.GzLayer(b, mkTar(b, []tent{{h: regH("data/blob", 0o644, 0, 0), content: string(data)}}))
	ref, _ := reg.Push("bench/c:v1", templatetest.Image(b, appConfig, busyboxLayer(b), appLayer(b), big))
	reg.DockerConfig(b, reg.Pass)
	const size = 128 << 20
	var ours, crane time.Duration
	steps := &phaseTimes{}
	b.ResetTimer()
	for range b.N {
		_, repo := templatetest.Repo(b)
		t0 := time.Now()
		steps.start(t0)
		po := PullOptions{CacheDir: b.TempDir(), Progress: func(PullProgress) { steps.mark("pull") }}
		if _, _, _, err := ImportImage(b.Context(), repo, "c", ref, po, ImageOptions{Size: size, Progress: func(p Progress) { steps.mark(p.Phase) }}, b.TempDir()); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		steps.mark("end")
		craneBuild(b, ref, size)
		ours, crane = ours+t1.Sub(t0), crane+time.Since(t1)
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64(ours)/float64(crane), "import/crane+mkfs")
	fmt.Printf("import %v, crane pull + tar -x + mkfs.ext4 -d %v: ratio %.2f\n", (ours / n).Round(time.Millisecond), (crane / n).Round(time.Millisecond), float64(ours)/float64(crane))
	fmt.Printf("import steps (mean per run, each until the next starts): %s\n", steps)
	// What the crane baseline does not do at all: the store's upload (its
	// durable writes; e2fsck runs beside it) and the template's metadata.
	store := steps.total["upload"] + steps.total["stored"]
	b.ReportMetric(float64(ours-store)/float64(crane), "without-store/crane+mkfs")
	fmt.Printf("without the store's upload and metadata (%v a run): ratio %.2f\n", (store / n).Round(time.Millisecond), float64(ours-store)/float64(crane))
}

// phaseTimes adds up, per phase of an import, the time from its first
// report to the next phase's.
type phaseTimes struct {
	order []string
	total map[string]time.Duration
	runs  int
	cur   string
	since time.Time
}

func (p *phaseTimes) start(t time.Time) {
	if p.total == nil {
		p.total = map[string]time.Duration{}
	}
	p.runs++
	p.cur, p.since = "resolve", t
}

func (p *phaseTimes) mark(phase string) {
	if phase == p.cur {
		return
	}
	now := time.Now()
	if _, ok := p.total[p.cur]; !ok {
		p.order = append(p.order, p.cur)
	}
	p.total[p.cur] += now.Sub(p.since)
	p.cur, p.since = phase, now
}

func (p *phaseTimes) String() string {
	var b strings.Builder
	for _, k := range p.order {
		fmt.Fprintf(&b, "%s %v, ", k, (p.total[k] / time.Duration(p.runs)).Round(time.Millisecond))
	}
	return strings.TrimSuffix(b.String(), ", ")
}

func craneBuild(b *testing.B, ref string, size int64) {
	img, err := crane.Pull(ref, crane.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		b.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	untar := exec.Command("tar", "-x", "-C", tree)
	untar.Stdin = rc
	if out, err := untar.CombinedOutput(); err != nil {
		b.Fatalf("tar -x: %v: %s", err, out)
	}
	out := filepath.Join(dir, "root.ext4")
	f, err := os.Create(out)
	if err != nil {
		b.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	if o, err := exec.Command("mkfs.ext4", "-q", "-F", "-t", "ext4", "-b", "4096", "-d", tree, out).CombinedOutput(); err != nil {
		b.Fatalf("mkfs.ext4: %v: %s", err, o)
	}
}
