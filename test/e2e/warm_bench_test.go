package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/template"
)

// warmBenchPool is the warm pool's size in BenchmarkWarmVsColdClaim: two
// members, so a second warm claim can be taken while the first one's
// refill boots beside it.
const warmBenchPool = 2

// coldTemplate is the busybox image under another name: a template with
// no pool, so its claims are cold on the pool's own ctld.
const coldTemplate = "busycold"

// BenchmarkWarmVsColdClaim (issue 27's benchmarks) runs a real ctld with
// `--warm-pool busybox=2`, then the same one without a pool.
//
// Latency: CTLD_BENCH_CLAIMS rounds (default 8), each: wait until the pool
// is full and quiet (2 idle, none booting), a warm claim (the steady
// pool's case), then, once the pool's refill of that member is booting, a
// second warm claim beside that boot (the pool's worst case; where the
// demo's warm claims were), both released; then, the pool full and quiet
// again, a cold claim of the same spec of template busycold (the busybox
// image, no pool) on the same ctld, released. It prints p50/p99 of each
// step (the claim's timings) with its share of the claim's total, the
// ratios warm/cold (goals <= 0.1 at p50, <= 0.3 at p99) and beside/quiet.
//
// Throughput: with the pool full, 2 claims take (drain) its members, then
// CTLD_BENCH_THROUGHPUT (default 8) claims back to back while the pool
// refills; then ctld restarts without the pool (its members destroyed with
// a cleanup proof) and does the same (its 2 drain claims are cold, so both
// runs have the same guests live): claims/s of each and pool/no pool (goal
// >= 1.0: a pool never makes claims slower). Every sandbox is released
// with a clean proof.
// Run: make bench VM_PKGS=./test/e2e BENCH='^BenchmarkWarmVsColdClaim$$' CTLD_BENCH_CLAIMS=8
func BenchmarkWarmVsColdClaim(b *testing.B) {
	n := envInt("CTLD_BENCH_CLAIMS", 8)
	k := envInt("CTLD_BENCH_THROUGHPUT", 8)
	// One env: two ctlds on one host would share its netns and link
	// names, address pool and disk project range (each sweeps the other's
	// objects as orphans), so the pool-less ctld is this one restarted.
	pe := newDiskEnv(b)
	if err := template.BuildBusybox(filepath.Join(pe.stateDir, "templates", coldTemplate), "/bin/busybox"); err != nil {
		b.Fatalf("build template %s: %v", coldTemplate, err)
	}
	poolArgs := []string{"--warm-pool", fmt.Sprintf("busybox=%d", warmBenchPool)}
	pe.args = append(pe.args, poolArgs...)
	pe.start("a")
	pe.waitPrimary("a", 2*time.Minute)
	pc := pe.client()

	quiet := func(p api.WarmPool) bool { return p.Idle == warmBenchPool && p.Booting == 0 }
	res := map[string]series{"warm": {}, "beside": {}, "cold": {}}
	for i := range n {
		waitPool(b, pc, "full and quiet", quiet)
		wid, bid, cid := fmt.Sprintf("warm%d", i), fmt.Sprintf("beside%d", i), fmt.Sprintf("cold%d", i)
		w := claimTimed(b, pc, wid, claimReq("c-"+wid, 1), true, res["warm"])
		waitPool(b, pc, "refilling", func(p api.WarmPool) bool { return p.Booting > 0 })
		bs := claimTimed(b, pc, bid, claimReq("c-"+bid, 1), true, res["beside"])
		releaseClean(b, pc, wid)
		releaseClean(b, pc, bid)
		waitPool(b, pc, "full and quiet", quiet)
		creq := claimReq("c-"+cid, 1)
		creq.RootFS.Template = coldTemplate
		c := claimTimed(b, pc, cid, creq, false, res["cold"])
		releaseClean(b, pc, cid)
		fmt.Fprintf(os.Stderr, "bench: round %d: warm total %.0f ms (agent claim %.0f) | warm beside a member boot %.0f ms (agent claim %.0f) | cold %.0f ms (runsc %.0f, proof %.0f)\n",
			i, w.TotalMS, w.ProofMS, bs.TotalMS, bs.ProofMS, c.TotalMS, stepMS(c, "runsc"), c.ProofMS)
	}
	wr, br, cr := res["warm"], res["beside"], res["cold"]
	for _, step := range []string{"admit", "lease", "rootfs", "network", "agent+bundle", "runsc", "proof", "total", "client wall"} {
		b.Logf("claim %-12s warm p50 %7.1f p99 %7.1f ms (%3.0f%%) | cold p50 %7.1f p99 %7.1f ms (%3.0f%%) | warm/cold p50 %.3f p99 %.3f",
			step, pct(wr[step], 50), pct(wr[step], 99), share(wr, step), pct(cr[step], 50), pct(cr[step], 99), share(cr, step),
			ratio(pct(wr[step], 50), pct(cr[step], 50)), ratio(pct(wr[step], 99), pct(cr[step], 99)))
	}
	b.Logf("(warm: lease = the lease's resize to the claim's limits, rootfs = its disk quota, network = its policy entries, proof = the member agent's claim round trip; (share) = the step's sum over the claims' total)")
	for _, step := range []string{"network", "proof", "total"} {
		b.Logf("warm claim beside a member boot %-7s p50 %7.1f p99 %7.1f ms | beside/quiet p50 %.2f p99 %.2f",
			step, pct(br[step], 50), pct(br[step], 99), ratio(pct(br[step], 50), pct(wr[step], 50)), ratio(pct(br[step], 99), pct(wr[step], 99)))
	}
	w50, w99 := ratio(pct(wr["total"], 50), pct(cr["total"], 50)), ratio(pct(wr["total"], 99), pct(cr["total"], 99))
	b.Logf("warm/cold claim total, n=%d each: p50 %.3f (goal <= 0.1) p99 %.3f (goal <= 0.3)", n, w50, w99)
	b.ReportMetric(w50, "warm/cold-p50")
	b.ReportMetric(w99, "warm/cold-p99")

	// Throughput, the pool full again: the same spec with and without the
	// pool, each claim's CPU such that all of them and a refilled pool fit.
	waitPool(b, pc, "full and quiet", quiet)
	node, err := pc.Node(ctx(b, time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	req := claimReq("", 1)
	req.Resources.CPUMillis = max(10, (node.Capacity.Allocatable.CPUMillis-node.Capacity.Warm.CPUMillis)/int64(k+warmBenchPool))
	req.Resources.MemoryBytes = node.Capacity.Warm.MemoryBytes / warmBenchPool // a member's: the least a pooled claim may ask
	type run struct {
		name, prefix string
		rate         float64
		hits         int
	}
	runs := []*run{{name: "pool", prefix: "p"}, {name: "no pool", prefix: "n"}}
	for _, r := range runs {
		if r.name == "no pool" {
			// The same ctld without the pool: its members go with a
			// cleanup proof when it takes over (none booting at the
			// stop: a boot under emulation can outlast the stop's grace).
			if st, err := pc.Node(ctx(b, time.Minute)); err == nil {
				b.Logf("pool after its throughput run: %+v", st.WarmPools)
			}
			waitPool(b, pc, "full and quiet", quiet)
			pe.restartWithoutPool(poolArgs)
		}
		var ids []string
		for j := range warmBenchPool {
			id := fmt.Sprintf("%s-drain%d", r.prefix, j)
			rq := req
			rq.OperationID = "c-" + id
			if _, err := pc.Claim(ctx(b, 5*time.Minute), id, rq); err != nil {
				b.Fatalf("%s: claim %s: %v", r.name, id, err)
			}
			ids = append(ids, id)
		}
		t0 := time.Now()
		for j := range k {
			id := fmt.Sprintf("%s-tp%d", r.prefix, j)
			rq := req
			rq.OperationID = "c-" + id
			got, err := pc.Claim(ctx(b, 5*time.Minute), id, rq)
			if err != nil {
				b.Fatalf("%s: claim %s: %v", r.name, id, err)
			}
			if strings.HasPrefix(got.Sandbox.ContainerID, "warm-") {
				r.hits++
			}
			ids = append(ids, id)
		}
		took := time.Since(t0)
		r.rate = float64(k) / took.Seconds()
		fmt.Fprintf(os.Stderr, "bench: throughput %s: %d claims of %dm CPU in %v (%d took a member)\n", r.name, k, req.Resources.CPUMillis, took.Round(time.Millisecond), r.hits)
		for _, id := range ids {
			releaseClean(b, pc, id)
		}
	}
	b.Logf("throughput, %d claims back to back (%dm CPU, %d MiB) after %d drained the pool: pool refilling %.3f claims/s (%d of %d took a member) | no pool %.3f claims/s | pool/no pool %.2f (goal >= 1.0)",
		k, req.Resources.CPUMillis, req.Resources.MemoryBytes>>20, warmBenchPool, runs[0].rate, runs[0].hits, k, runs[1].rate, ratio(runs[0].rate, runs[1].rate))
	b.ReportMetric(ratio(runs[0].rate, runs[1].rate), "pool/nopool-claims/s")
}

// waitPool waits (bounded) until the busybox pool's state satisfies ok.
func waitPool(b testing.TB, c *api.Client, what string, ok func(api.WarmPool) bool) {
	b.Helper()
	var last []api.WarmPool
	for deadline := time.Now().Add(5 * time.Minute); ; {
		nd, err := c.Node(ctx(b, time.Minute))
		if err == nil {
			last = nd.WarmPools
			for _, p := range nd.WarmPools {
				if p.Template == "busybox" && ok(p) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("warm pool not %s within 5m: %+v, %v", what, last, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// claimTimed claims id, checks it took a member (warm) or not, and adds
// its step timings to s; it returns them.
func claimTimed(b *testing.B, c *api.Client, id string, req api.ClaimRequest, warm bool, s series) api.Timings {
	b.Helper()
	t0 := time.Now()
	r, err := c.Claim(ctx(b, 5*time.Minute), id, req)
	if err != nil {
		b.Fatalf("claim %s: %v", id, err)
	}
	wall := float64(time.Since(t0).Microseconds()) / 1000
	tm := r.Sandbox.Timings
	if got := strings.HasPrefix(r.Sandbox.ContainerID, "warm-"); got != warm || (tm.RunscMS == 0) != warm {
		b.Fatalf("claim %s: container %s, runsc %.0f ms: want warm=%v", id, r.Sandbox.ContainerID, tm.RunscMS, warm)
	}
	s.add("admit", tm.AdmitMS)
	s.add("lease", tm.LeaseMS)
	s.add("rootfs", tm.RootFSMS)
	s.add("network", tm.NetworkMS)
	s.add("agent+bundle", stepMS(tm, "agent")+stepMS(tm, "bundle"))
	s.add("runsc", stepMS(tm, "runsc"))
	s.add("proof", tm.ProofMS)
	s.add("total", tm.TotalMS)
	s.add("client wall", wall)
	return tm
}

// stepMS is the make time of resource's steps in tm.
func stepMS(tm api.Timings, resource string) float64 {
	var v float64
	for _, st := range tm.Steps {
		if st.Resource == resource {
			v += st.MakeMS
		}
	}
	return v
}

// share is step's sum over the claims' total, in percent.
func share(s series, step string) float64 {
	var a, t float64
	for i, v := range s[step] {
		a += v
		t += s["total"][i]
	}
	return 100 * ratio(a, t)
}

// releaseClean releases generation 1 of id and requires a clean proof.
func releaseClean(b testing.TB, c *api.Client, id string) {
	b.Helper()
	rel, err := c.Release(ctx(b, 5*time.Minute), id, api.ReleaseRequest{OperationID: "r-" + id, Generation: 1})
	if err != nil {
		b.Fatalf("release %s: %v", id, err)
	}
	if !rel.Proof.Clean {
		b.Fatalf("release %s: cleanup proof not clean: %+v", id, rel.Proof)
	}
}
