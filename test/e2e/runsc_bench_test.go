package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
)

// BenchmarkRunscBuilds compares Debian's runsc with the current gVisor
// build (issue 27) in one run: two nodes, one per build (each at its
// default platform: ptrace and systrap), taking turns. Per build: the cold
// claim's steps (runsc create+start, readiness proof, total), the exec
// round trip of /bin/true through the agent, and a syscall-heavy guest loop
// (busybox dd of CTLD_BENCH_SYSCALLS one-byte blocks from /dev/zero to
// /dev/null: twice that many read/write syscalls), timed as the exec's
// wall time minus the same guest's /bin/true p50. CTLD_BENCH_CLAIMS
// (default 6) claims per build, 5 execs each.
// Run: make bench VM_PKGS=./test/e2e BENCH=RunscBuilds (the Makefile passes
// the current build's path as CTLD_RUNSC_CURRENT).
func BenchmarkRunscBuilds(b *testing.B) {
	n := envInt("CTLD_BENCH_CLAIMS", 6)
	blocks := envInt("CTLD_BENCH_SYSCALLS", 20000)
	current := os.Getenv("CTLD_RUNSC_CURRENT")
	if current == "" {
		b.Fatal("CTLD_RUNSC_CURRENT is not set: run it with make bench (test/vm/setup.sh installs the current runsc)")
	}
	debian, err := exec.LookPath("runsc")
	if err != nil {
		b.Fatal(err)
	}
	bins := []string{debian, current}
	names := make([]string, len(bins))
	envs := make([]*env, len(bins))
	for k, bin := range bins {
		v, err := runsc.Version(ctx(b, time.Minute), bin)
		if err != nil {
			b.Fatal(err)
		}
		names[k] = v
		envs[k] = newEnv(b)
		envs[k].args = append(envs[k].args, "--runsc", bin)
	}
	for _, e := range envs {
		e.start("a")
		e.waitPrimary("a", 2*time.Minute)
	}
	res := []series{{}, {}}
	dd := fmt.Sprintf("dd if=/dev/zero of=/dev/null bs=1 count=%d 2>/dev/null", blocks)
	for i := range n {
		for k, e := range envs {
			c := e.client()
			id := fmt.Sprintf("rb%d", i)
			r, err := c.Claim(ctx(b, 3*time.Minute), id, claimReq("claim-"+id, 1))
			if err != nil {
				b.Fatalf("%s: claim %s: %v", names[k], id, err)
			}
			tm := r.Sandbox.Timings
			s := res[k]
			s.add("runsc", tm.RunscMS)
			s.add("proof", tm.ProofMS)
			s.add("total", tm.TotalMS)
			var trues []float64
			for range 5 {
				t0 := time.Now()
				x, err := c.Exec(ctx(b, time.Minute), id, api.ExecRequest{Args: []string{"/bin/true"}})
				if err != nil || x.ExitCode != 0 {
					b.Fatalf("%s: exec /bin/true: %+v %v", names[k], x, err)
				}
				ms := float64(time.Since(t0).Microseconds()) / 1000
				trues = append(trues, ms)
				s.add("exec /bin/true", ms)
			}
			t0 := time.Now()
			x, err := c.Exec(ctx(b, 10*time.Minute), id, api.ExecRequest{Args: []string{"/bin/sh", "-c", dd}})
			if err != nil || x.ExitCode != 0 {
				b.Fatalf("%s: exec dd: %+v %v", names[k], x, err)
			}
			s.add("syscall loop", float64(time.Since(t0).Microseconds())/1000-pct(trues, 50))
			if _, err := c.Release(ctx(b, 3*time.Minute), id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1}); err != nil {
				b.Fatalf("%s: release %s: %v", names[k], id, err)
			}
			fmt.Fprintf(os.Stderr, "bench: %s: claim %s total %.0f ms\n", names[k], id, tm.TotalMS)
		}
	}
	for _, step := range []string{"runsc", "proof", "total", "exec /bin/true", "syscall loop"} {
		d, c := res[0][step], res[1][step]
		b.Logf("%-14s %s p50 %8.1f p99 %8.1f ms | %s p50 %8.1f p99 %8.1f ms | current/debian p50 %.2f p99 %.2f",
			step, names[0], pct(d, 50), pct(d, 99), names[1], pct(c, 50), pct(c, 99), ratio(pct(c, 50), pct(d, 50)), ratio(pct(c, 99), pct(d, 99)))
	}
	for k := range envs {
		b.Logf("%s: claim total / runsc create+start at p50: %.2f; proof / runsc p50 %.2f (n=%d claims, syscall loop %d read+write pairs)",
			names[k], pct(res[k]["total"], 50)/pct(res[k]["runsc"], 50), pct(res[k]["proof"], 50)/pct(res[k]["runsc"], 50), n, blocks)
	}
	// The second env's leak check runs first and would count the first
	// env's live ctld, cgroup parent and nft table as its leaks: end the
	// first now.
	envs[0].releaseAll()
	for slot := range envs[0].procs {
		envs[0].stop(slot)
	}
	if err := os.Remove(filepath.Join(ktest.CgroupRoot, envs[0].parent)); err != nil && !os.IsNotExist(err) {
		b.Errorf("remove cgroup parent: %v", err)
	}
	if err := ktest.DeleteNftTable(envs[0].nftTable); err != nil {
		b.Errorf("delete nft table: %v", err)
	}
}
