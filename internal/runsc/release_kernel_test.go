package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killLease empties a lease the way lease.Manager.Kill does: cgroup.kill,
// then cgroup.events polled every 10 ms until "populated 0".
func killLease(ctx context.Context, dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("cgroup.kill: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "populated 0") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s to empty: %w", dir, ctx.Err())
		case <-tick.C:
		}
	}
}

func startContainer(t testing.TB, e kernelEnv, id string) (sandboxPid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := e.r.Create(ctx, id, e.bundle); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	st, err := e.r.State(ctx, id)
	if err != nil || st.Status != "running" {
		t.Fatalf("state %+v, %v; want running", st, err)
	}
	return st.Pid
}

// TestKernelDeleteAfterLeaseKill proves the release fast path on a real
// guest: runsc's state files are exactly what `runsc list` reads (so the
// proof may read them instead of starting runsc list); ctld's containers
// need nothing from `runsc delete` but removing those files (the state
// runsc wrote passes plainDelete); while the guest runs the files are never
// removed by us; once the lease's cgroup.kill has emptied it, Delete
// removes them without runsc, and nothing of the container is left: not
// for runsc (list, state), not in /proc, not for the leak check.
func TestKernelDeleteAfterLeaseKill(t *testing.T) {
	const id = "rt-fast"
	e := setupKernel(t, id)
	r := e.r
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pid := startContainer(t, e, id)

	listed, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	known, err := r.Known()
	if err != nil || !slices.Equal(listed, known) || !slices.Equal(listed, []string{id}) {
		t.Fatalf("runsc list = %q, state files name %q (%v); want both [%s]", listed, known, err, id)
	}
	files, err := stateFiles(r.Root, id)
	want := []string{stateName(id, "lock"), stateName(id, "state")}
	if r.Version != DebianVersion {
		// A current build's control socket file.
		want = append(want, controlSocketName(id))
	}
	if err != nil || !slices.Equal(files, want) {
		t.Fatalf("state files %q, %v; want %q", files, err, want)
	}
	b, err := os.ReadFile(filepath.Join(r.Root, stateName(id, "state")))
	if err != nil {
		t.Fatal(err)
	}
	var s runscState
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if why := s.plainDelete(r.Root, id); why != "" || s.Sandbox.Pid != pid || s.GoferPid <= 0 {
		t.Fatalf("runsc's state of a ctld container: %q, sandbox pid %d (runsc state says %d), gofer %d; want a plain delete:\n%s", why, s.Sandbox.Pid, pid, s.GoferPid, b)
	}

	// Running: never removed by us.
	if removed, why, err := r.removeDead(id); removed || err != nil || !strings.Contains(why, "runs") {
		t.Fatalf("removeDead of a running container = %v, %q, %v; want refused because it runs", removed, why, err)
	}
	if ok, detail := r.CheckGone(ctx, id); ok {
		t.Fatalf("CheckGone true for a running container: %s", detail)
	}

	if err := killLease(ctx, e.leaseDir); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	removed, why, err := r.removeDead(id)
	if err != nil || !removed {
		t.Fatalf("removeDead after cgroup.kill = %v, %q, %v; want removed", removed, why, err)
	}
	t.Logf("removed the state of the killed container in %v", time.Since(t0))
	if ents, err := os.ReadDir(r.Root); err != nil || len(ents) != 0 {
		t.Errorf("runsc root after removeDead: %v, %v; want empty", ents, err)
	}
	for _, p := range []int{s.Sandbox.Pid, s.GoferPid} {
		if dead, why := r.pidDead(p); !dead {
			t.Errorf("pid %d after cgroup.kill: %s", p, why)
		}
	}
	if ok, detail := r.CheckGone(ctx, id); !ok {
		t.Errorf("CheckGone: %s", detail)
	}
	if ids, err := r.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("runsc list after = %q, %v", ids, err)
	}
	if _, err := r.State(ctx, id); !errors.Is(err, ErrNotExist) {
		t.Errorf("runsc state after: %v, want ErrNotExist", err)
	}
	// Delete is idempotent: with no state left it asks runsc, which
	// knows nothing of it.
	if err := r.Delete(ctx, id); err != nil {
		t.Errorf("Delete after: %v", err)
	}
}

// BenchmarkRelease compares, on real guests in the same run, the runsc
// part of a teardown: "runsc" is today's path (`runsc kill --all`, then
// `runsc delete --force`; proof check: `runsc list` + state files + /proc),
// "bare" is `runsc delete --force` alone, "fast" is the lease's
// cgroup.kill, then Delete removing the dead container's state itself
// (proof check: state files + /proc). Each round starts three guests and
// takes each down by one path, rotating the order; every proof check must
// pass. Prints p50/p99 of remove, check and both, and the ratios to
// "runsc". Run: make bench VM_PKGS=./internal/runsc BENCH=Release
// (CTLD_BENCH_RELEASES rounds, default 8).
func BenchmarkRelease(b *testing.B) {
	rounds := 8
	if v, err := fmt.Sscan(os.Getenv("CTLD_BENCH_RELEASES"), &rounds); v != 1 || err != nil || rounds < 1 {
		rounds = 8
	}
	ctx := context.Background()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	res := map[string]map[string][]float64{"runsc": {}, "bare": {}, "fast": {}}
	type path struct {
		name   string
		remove func(e kernelEnv, id string) error
		check  func(e kernelEnv, id string) (bool, string)
	}
	newCheck := func(e kernelEnv, id string) (bool, string) { return e.r.CheckGone(ctx, id) }
	paths := []path{
		{"runsc", func(e kernelEnv, id string) error {
			_ = e.r.Kill(ctx, id, syscall.SIGKILL, true)
			return e.r.runscDelete(ctx, id)
		}, func(e kernelEnv, id string) (bool, string) {
			if ids, err := e.r.List(ctx); err != nil || slices.Contains(ids, id) {
				return false, fmt.Sprintf("runsc list: %q, %v", ids, err)
			}
			return e.r.CheckGone(ctx, id)
		}},
		{"bare", func(e kernelEnv, id string) error { return e.r.runscDelete(ctx, id) }, newCheck},
		{"fast", func(e kernelEnv, id string) error {
			t0 := time.Now()
			if err := killLease(ctx, e.leaseDir); err != nil {
				return err
			}
			t1 := time.Now()
			if removed, why, err := e.r.removeDead(id); err != nil || !removed {
				return fmt.Errorf("fast path not taken: %s %v", why, err)
			}
			res["fast"]["kill"] = append(res["fast"]["kill"], ms(t1.Sub(t0)))
			res["fast"]["drop"] = append(res["fast"]["drop"], ms(time.Since(t1)))
			return nil
		}, newCheck},
	}
	b.ResetTimer()
	for i := range rounds {
		for k := range paths {
			p := paths[(i+k)%len(paths)]
			id := fmt.Sprintf("rb%d-%s", i, p.name)
			b.StopTimer()
			e := setupKernel(b, id)
			startContainer(b, e, id)
			b.StartTimer()
			t0 := time.Now()
			if err := p.remove(e, id); err != nil {
				b.Fatalf("%s: remove %s: %v", p.name, id, err)
			}
			t1 := time.Now()
			ok, detail := p.check(e, id)
			t2 := time.Now()
			if !ok {
				b.Fatalf("%s: proof check of %s failed: %s", p.name, id, detail)
			}
			res[p.name]["remove"] = append(res[p.name]["remove"], ms(t1.Sub(t0)))
			res[p.name]["check"] = append(res[p.name]["check"], ms(t2.Sub(t1)))
			res[p.name]["total"] = append(res[p.name]["total"], ms(t2.Sub(t0)))
		}
	}
	b.StopTimer()
	for _, step := range []string{"remove", "check", "total"} {
		base := res["runsc"][step]
		for _, p := range paths {
			v := res[p.name][step]
			b.Logf("release %-6s %-5s p50 %8.1f p99 %8.1f ms | ratio to runsc p50 %.3f p99 %.3f (n=%d)",
				p.name, step, pct(v, 50), pct(v, 99), pct(v, 50)/pct(base, 50), pct(v, 99)/pct(base, 99), len(v))
		}
	}
	for _, step := range []string{"kill", "drop"} {
		v := res["fast"][step]
		b.Logf("release fast   %-5s p50 %8.1f p99 %8.1f ms (lease cgroup.kill until empty; removeDead)", step, pct(v, 50), pct(v, 99))
	}
	b.ReportMetric(pct(res["fast"]["total"], 50)/pct(res["runsc"]["total"], 50), "fast/runsc-p50")
	b.ReportMetric(pct(res["bare"]["remove"], 50)/pct(res["runsc"]["remove"], 50), "bare/runsc-remove-p50")
}

// pct is the p-th percentile (nearest rank) of v.
func pct(v []float64, p int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}
