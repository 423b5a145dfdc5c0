package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// BenchmarkClaimMetering claims and releases sandboxes on two real ctld
// nodes, one with usage metering off (--usage-interval 0) and one at a
// 1 s interval, each holding CTLD_BENCH_LIVE live generations (default 0: two nodes on one host share the link and netns names of their address slots, so live ones collide)
// that every tick meters, alternating so both see the same machine; it
// prints the claim p50/p99 (client wall time) of each and the ratio
// metered/off (issue 22's goal: <= 1.02 at p50), and checks the metered
// node's stream has interval records and the other only final ones.
// Run: make bench VM_PKGS=./test/e2e BENCH=ClaimMetering (CTLD_BENCH_CLAIMS, default 12)
func BenchmarkClaimMetering(b *testing.B) {
	n := envInt("CTLD_BENCH_CLAIMS", 12)
	live := envInt("CTLD_BENCH_LIVE", 0)
	names := []string{"metering off", "metering 1s"}
	envs := []*env{newDiskEnv(b), newDiskEnv(b)}
	envs[0].args = append(envs[0].args, "--usage-interval", "0")
	// Both hold live generations on one scratch filesystem: their disk
	// project ranges must not meet.
	envs[1].args = append(envs[1].args, "--usage-interval", "1s", "--disk-project-base", "33554432")
	for _, e := range envs {
		e.start("a")
		e.waitPrimary("a", 2*time.Minute)
	}
	for k, e := range envs {
		for i := range live {
			// Ids differ between the nodes: runsc names its sockets by them.
			id := fmt.Sprintf("live%d-%d", k, i)
			if _, err := e.client().Claim(ctx(b, 3*time.Minute), id, claimReq("claim-"+id, 1)); err != nil {
				b.Fatalf("%s: claim %s: %v", names[k], id, err)
			}
		}
	}
	res := []series{{}, {}}
	for i := range n {
		for k, e := range envs {
			c := e.client()
			cx := ctx(b, 3*time.Minute)
			id := fmt.Sprintf("bench%d-%d", k, i)
			t0 := time.Now()
			if _, err := c.Claim(cx, id, claimReq("claim-"+id, 1)); err != nil {
				b.Fatalf("%s: claim %s: %v", names[k], id, err)
			}
			res[k].add("claim", float64(time.Since(t0).Microseconds())/1000)
			t1 := time.Now()
			if _, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1}); err != nil {
				b.Fatalf("%s: release %s: %v", names[k], id, err)
			}
			res[k].add("release", float64(time.Since(t1).Microseconds())/1000)
		}
	}
	var records [2]struct{ interval, final int }
	for k, e := range envs {
		for after := uint64(0); ; {
			p, err := e.client().Usage(ctx(b, time.Minute), after, api.MaxUsageLimit)
			if err != nil {
				b.Fatalf("%s: usage: %v", names[k], err)
			}
			for _, r := range p.Records {
				if r.Final {
					records[k].final++
				} else {
					records[k].interval++
				}
			}
			if len(p.Records) == 0 {
				break
			}
			after = p.Next
		}
	}
	c0, c1 := pct(res[0]["claim"], 50), pct(res[1]["claim"], 50)
	r0, r1 := pct(res[0]["release"], 50), pct(res[1]["release"], 50)
	b.Logf("claim (client wall), n=%d each, %d live generations per node: %s p50 %.0f ms p99 %.0f ms; %s p50 %.0f ms p99 %.0f ms; ratio 1s/off p50 %.3f p99 %.3f",
		n, live, names[0], c0, pct(res[0]["claim"], 99), names[1], c1, pct(res[1]["claim"], 99), ratio(c1, c0), ratio(pct(res[1]["claim"], 99), pct(res[0]["claim"], 99)))
	b.Logf("release p50: off %.0f ms, 1s %.0f ms (ratio %.3f); usage records: off %d interval + %d final, 1s %d interval + %d final",
		r0, r1, ratio(r1, r0), records[0].interval, records[0].final, records[1].interval, records[1].final)
	// Interval records need a generation ready at a tick: with no live
	// ones, the claims' short ready windows may see none.
	if records[0].interval != 0 || records[0].final != n || records[1].final != n || (live > 0 && records[1].interval == 0) {
		b.Fatalf("usage records (interval, final): off %+v, 1s %+v; want (0, %d) and (>0 with live generations, %d)", records[0], records[1], n, n)
	}
	b.ReportMetric(ratio(c1, c0), "claim-1s/off-p50")
}
