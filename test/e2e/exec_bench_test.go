package e2e

import (
	"io"
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
