package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/node/ha"
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

// BenchmarkFailover measures kill -9 of the primary to the standby serving
// the API, with no sandboxes (the baseline, same run) and with N live ones
// (CTLD_BENCH_SANDBOXES, default 50; goal <= 300 ms), and checks a guest
// still answers after each takeover.
// Run: make bench VM_PKGS=./test/e2e BENCH=Failover VM_MEM=8192
func BenchmarkFailover(b *testing.B) {
	n := 50
	if v, err := strconv.Atoi(os.Getenv("CTLD_BENCH_SANDBOXES")); err == nil && v > 0 {
		n = v
	}
	const rounds = 3
	e := newEnv(b)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	e.start("b")
	e.waitRole("b", ha.RoleStandby, time.Minute)
	c := e.client()
	primary, standby := "a", "b"
	failover := func() float64 {
		start := time.Now()
		e.kill9(primary)
		e.waitPrimary(standby, 2*time.Minute)
		d := time.Since(start)
		e.start(primary) // rejoins as standby
		e.waitRole(primary, ha.RoleStandby, time.Minute)
		primary, standby = standby, primary
		fmt.Fprintf(os.Stderr, "bench: failover to ctld@%s in %v\n", standby, d)
		return float64(d.Microseconds()) / 1000
	}
	var base []float64
	for i := 0; i < rounds; i++ {
		base = append(base, failover())
	}

	// Share the allocatable CPU: ctld does not overcommit, and the lease's
	// cpu.max throttles the guest's boot too.
	node, err := c.Node(ctx(b, time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	cpu := max(node.Capacity.Allocatable.CPUMillis/int64(n), 10)
	b.Logf("%d sandboxes of %dm CPU, 96 MiB", n, cpu)
	req := func(i int) api.ClaimRequest {
		r := claimReq(fmt.Sprintf("claim-fo%d", i), 1)
		r.Resources = api.Resources{CPUMillis: cpu, MemoryBytes: 96 << 20, PIDs: 64}
		return r
	}
	sem := make(chan struct{}, 8)
	errs := make(chan error, n)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem }()
			t := time.Now()
			_, err := c.Claim(ctx(b, 10*time.Minute), fmt.Sprintf("fo%d", i), req(i))
			// Progress on stderr: b.Logf prints only when the benchmark ends.
			fmt.Fprintf(os.Stderr, "bench: claim fo%d: %v in %v\n", i, err, time.Since(t).Round(time.Millisecond))
			errs <- err
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			b.Fatalf("claim: %v", err)
		}
	}
	b.Logf("%d sandboxes claimed in %v", n, time.Since(t0).Round(time.Second))

	var live []float64
	for i := 0; i < rounds; i++ {
		live = append(live, failover())
		r, err := c.Exec(ctx(b, time.Minute), fmt.Sprintf("fo%d", i), api.ExecRequest{Args: []string{"/bin/echo", "alive"}})
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "alive" {
			b.Fatalf("guest after failover: %q, %v", r.Stdout, err)
		}
		l, err := c.List(ctx(b, time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		ready := 0
		for _, s := range l.Sandboxes {
			if s.State == api.StateReady {
				ready++
			}
		}
		if ready != n {
			b.Fatalf("after failover %d of %d sandboxes ready", ready, n)
		}
	}
	b.Logf("failover, no sandboxes (baseline): p50 %.0f ms, max %.0f ms (%d rounds)", pct(base, 50), pct(base, 100), rounds)
	b.Logf("failover, %d live sandboxes:       p50 %.0f ms, max %.0f ms (%d rounds; goal <= 300 ms)", n, pct(live, 50), pct(live, 100), rounds)
	b.Logf("ratio live / baseline at p50: %.2f", pct(live, 50)/pct(base, 50))
	e.dumpLogs("reconciled")
}
