package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// BenchmarkClaim claims and releases sandboxes on a real ctld and prints
// p50/p99 of each claim step, and the ratio node prep (lease + rootfs +
// network) / runsc create+start, measured in the same run. Goal: <= 0.10 at p50.
// Run: make bench VM_PKGS=./test/e2e BENCH=Claim
func BenchmarkClaim(b *testing.B) {
	const n = 8
	e := newEnv(b)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	var lease, root, netw, runsc, proof, total []float64
	for i := 0; i < n; i++ {
		cx := ctx(b, 3*time.Minute)
		id := fmt.Sprintf("bench%d", i)
		r, err := c.Claim(cx, id, claimReq("claim-"+id, 1))
		if err != nil {
			b.Fatalf("claim %s: %v", id, err)
		}
		tm := r.Sandbox.Timings
		lease, root, netw = append(lease, tm.LeaseMS), append(root, tm.RootFSMS), append(netw, tm.NetworkMS)
		runsc, proof, total = append(runsc, tm.RunscMS), append(proof, tm.ProofMS), append(total, tm.TotalMS)
		if _, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1}); err != nil {
			b.Fatalf("release %s: %v", id, err)
		}
	}
	prep := make([]float64, n)
	for i := range prep {
		prep[i] = lease[i] + root[i] + netw[i]
	}
	for _, row := range []struct {
		name string
		v    []float64
	}{{"lease", lease}, {"rootfs", root}, {"network", netw}, {"runsc", runsc}, {"proof", proof}, {"total", total}, {"node prep", prep}} {
		b.Logf("claim %-9s p50 %8.1f ms  p99 %8.1f ms", row.name, pct(row.v, 50), pct(row.v, 99))
	}
	b.Logf("ratio node prep / runsc create+start at p50: %.3f (goal <= 0.10), n=%d", pct(prep, 50)/pct(runsc, 50), n)
}

func pct(v []float64, p int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}
