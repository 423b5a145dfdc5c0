package e2e

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// BenchmarkExecAgentVsRunsc measures the exec round trip of /bin/true
// through the API (JSON exec) via the guest agent and via `runsc exec`
// (?via=runsc) on the same guest, alternating, and prints p50/p99 of each
// and the ratio agent/runsc (issue 11's goal: <= 0.05 at p50).
// Run: make bench VM_PKGS=./test/e2e BENCH=ExecAgentVsRunsc (CTLD_BENCH_EXECS, default 50)
func BenchmarkExecAgentVsRunsc(b *testing.B) {
	n := envInt("CTLD_BENCH_EXECS", 50)
	e := newEnv(b)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	if _, err := c.Claim(ctx(b, 3*time.Minute), "bench", claimReq("c1", 1)); err != nil {
		b.Fatalf("claim: %v", err)
	}
	req := api.ExecRequest{Args: []string{"/bin/true"}}
	res := series{}
	for range n {
		for _, via := range []string{"agent", "runsc"} {
			cx := ctx(b, time.Minute)
			start := time.Now()
			var code int
			var err error
			if via == "agent" {
				var r api.ExecResult
				r, err = c.Exec(cx, "bench", req)
				code = r.ExitCode
			} else {
				code, err = c.ExecViaRunsc(cx, "bench", req, io.Discard, io.Discard)
			}
			if err != nil || code != 0 {
				b.Fatalf("exec /bin/true via %s: %d %v", via, code, err)
			}
			res.add(via, float64(time.Since(start).Microseconds())/1000)
		}
	}
	a50, a99, r50, r99 := pct(res["agent"], 50), pct(res["agent"], 99), pct(res["runsc"], 50), pct(res["runsc"], 99)
	b.Logf("exec /bin/true through the API, n=%d each: agent p50 %.1f ms p99 %.1f ms; runsc exec p50 %.1f ms p99 %.1f ms; agent/runsc p50 %.3f p99 %.3f",
		n, a50, a99, r50, r99, ratio(a50, r50), ratio(a99, r99))
	b.ReportMetric(a50, "agent-p50-ms")
	b.ReportMetric(r50, "runsc-p50-ms")
	b.ReportMetric(ratio(a50, r50), "agent/runsc-p50")
}

// BenchmarkClaimReadiness measures a claim's readiness step, the guest
// agent's first answer after `runsc start` (Timings.ProofMS), over
// CTLD_BENCH_CLAIMS (default 8) claims of the busybox template, one at a
// time, and after each a `runsc exec /bin/echo` on the same guest through
// the API (?via=runsc: the old readiness step's command, right after the
// claim: the guest is still young). It prints p50/p99 of each and
// readiness/echo (issue 11's goal: <= 0.1 of the old step).
// Run: make bench VM_PKGS=./test/e2e BENCH=ClaimReadiness
func BenchmarkClaimReadiness(b *testing.B) {
	n := envInt("CTLD_BENCH_CLAIMS", 8)
	e := newEnv(b)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	res := series{}
	for i := range n {
		id := fmt.Sprintf("ready-%d", i)
		r, err := c.Claim(ctx(b, 3*time.Minute), id, claimReq("c-"+id, 1))
		if err != nil {
			b.Fatalf("claim %s: %v", id, err)
		}
		res.add("proof", r.Sandbox.Timings.ProofMS)
		res.add("runsc", r.Sandbox.Timings.RunscMS)
		var out strings.Builder
		start := time.Now()
		code, err := c.ExecViaRunsc(ctx(b, time.Minute), id, api.ExecRequest{Args: []string{"/bin/echo", id}}, &out, io.Discard)
		if err != nil || code != 0 || out.String() != id+"\n" {
			b.Fatalf("runsc exec echo in %s: %d %v %q", id, code, err, out.String())
		}
		res.add("echo", float64(time.Since(start).Microseconds())/1000)
		if _, err := c.Release(ctx(b, 3*time.Minute), id, api.ReleaseRequest{OperationID: "r-" + id, Generation: 1}); err != nil {
			b.Fatalf("release %s: %v", id, err)
		}
	}
	p50, p99, e50, e99 := pct(res["proof"], 50), pct(res["proof"], 99), pct(res["echo"], 50), pct(res["echo"], 99)
	b.Logf("claim readiness (agent ready after runsc start), n=%d busybox claims: p50 %.0f ms p99 %.0f ms (all %v); runsc exec /bin/echo on the same guest after the claim p50 %.0f ms p99 %.0f ms; readiness/echo p50 %.2f p99 %.2f; runsc create+start p50 %.0f ms",
		n, p50, p99, res["proof"], e50, e99, ratio(p50, e50), ratio(p99, e99), pct(res["runsc"], 50))
	b.ReportMetric(p50, "proof-p50-ms")
	b.ReportMetric(p99, "proof-p99-ms")
	b.ReportMetric(ratio(p50, e50), "proof/echo-p50")
}
