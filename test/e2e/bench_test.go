package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/node/ha"
	"github.com/ctld/ctld/internal/node/journal"
	"github.com/ctld/ctld/internal/node/journal/journaltest"
	"golang.org/x/sys/unix"
)

// Benchmarks run with the state dir on the VM's real disk (/var/lib/ctld,
// XFS on a virtio disk), not tmpfs, so journal fsyncs cost what they cost
// on a host. Each compares an empty journal with one holding
// CTLD_BENCH_HISTORY (default 10,000) finished generations, in the same
// run, and prints the ratios (goal <= 1.2).

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// newDiskEnv is newEnv with its state dir on the VM's state disk.
func newDiskEnv(t testing.TB) *env {
	t.Helper()
	const xfsMagic = 0x58465342
	var st unix.Statfs_t
	if err := unix.Statfs("/var/lib/ctld", &st); err != nil || st.Type != xfsMagic {
		t.Fatalf("/var/lib/ctld is not the VM's XFS state disk (statfs type %#x, %v): benchmarks need a real disk", st.Type, err)
	}
	dir, err := os.MkdirTemp("/var/lib/ctld", "bench-")
	if err != nil {
		t.Fatal(err)
	}
	// Registered before newEnv's cleanup, so it runs after ctld stopped.
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := newEnv(t)
	e.stateDir = filepath.Join(dir, "state")
	return e
}

// seedHistory writes n finished generations into the env's journal with
// the journal API, before ctld opens it.
func (e *env) seedHistory(n int) {
	e.t.Helper()
	if err := os.MkdirAll(e.stateDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	t0 := time.Now()
	j, err := journal.Open(filepath.Join(e.stateDir, "journal.db"), 5*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	defer j.Close()
	if err := journaltest.SeedFinished(j, "hist", n); err != nil {
		e.t.Fatal(err)
	}
	st, _ := j.Stats()
	fi, _ := os.Stat(filepath.Join(e.stateDir, "journal.db"))
	fmt.Fprintf(os.Stderr, "bench: seeded %d finished generations (%d history records, journal %d MiB) in %v\n",
		n, st.History, fi.Size()>>20, time.Since(t0).Round(time.Millisecond))
}

type series map[string][]float64

func (s series) add(k string, v float64) { s[k] = append(s[k], v) }

// BenchmarkClaim claims and releases sandboxes on two real ctld nodes,
// one with an empty journal and one with 10,000 finished generations,
// alternating so both see the same machine, and prints p50/p99 of each
// step and the ratios history/empty; also node prep (lease + rootfs +
// network) / runsc create+start (goal <= 0.10 at p50).
// Run: make bench VM_PKGS=./test/e2e BENCH=Claim (CTLD_BENCH_CLAIMS, default 30)
func BenchmarkClaim(b *testing.B) {
	n := envInt("CTLD_BENCH_CLAIMS", 30)
	hist := envInt("CTLD_BENCH_HISTORY", 10000)
	names := []string{"empty", fmt.Sprintf("%d finished", hist)}
	envs := []*env{newDiskEnv(b), newDiskEnv(b)}
	envs[1].seedHistory(hist)
	for _, e := range envs {
		e.start("a")
		e.waitPrimary("a", 2*time.Minute)
	}
	res := []series{{}, {}}
	for i := 0; i < n; i++ {
		for k, e := range envs {
			c := e.client()
			cx := ctx(b, 3*time.Minute)
			id := fmt.Sprintf("bench%d", i)
			t0 := time.Now()
			r, err := c.Claim(cx, id, claimReq("claim-"+id, 1))
			if err != nil {
				b.Fatalf("%s journal: claim %s: %v", names[k], id, err)
			}
			wall := float64(time.Since(t0).Microseconds()) / 1000
			tm := r.Sandbox.Timings
			s := res[k]
			s.add("admit", tm.AdmitMS)
			s.add("lease", tm.LeaseMS)
			s.add("rootfs", tm.RootFSMS)
			s.add("network", tm.NetworkMS)
			s.add("node prep", tm.LeaseMS+tm.RootFSMS+tm.NetworkMS)
			s.add("runsc", tm.RunscMS)
			s.add("proof", tm.ProofMS)
			s.add("total", tm.TotalMS)
			s.add("client wall", wall)
			t1 := time.Now()
			if _, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1}); err != nil {
				b.Fatalf("%s journal: release %s: %v", names[k], id, err)
			}
			s.add("release", float64(time.Since(t1).Microseconds())/1000)
			fmt.Fprintf(os.Stderr, "bench: %s journal: claim %s total %.0f ms (admit %.2f ms)\n", names[k], id, tm.TotalMS, tm.AdmitMS)
		}
	}
	for _, step := range []string{"admit", "lease", "rootfs", "network", "node prep", "runsc", "proof", "total", "client wall", "release"} {
		e, f := res[0][step], res[1][step]
		b.Logf("claim %-11s empty p50 %8.2f p99 %8.2f ms | %s p50 %8.2f p99 %8.2f ms | ratio p50 %.2f p99 %.2f",
			step, pct(e, 50), pct(e, 99), names[1], pct(f, 50), pct(f, 99), pct(f, 50)/pct(e, 50), pct(f, 99)/pct(e, 99))
	}
	for k := range envs {
		b.Logf("%s journal: ratio node prep / runsc create+start at p50: %.3f (goal <= 0.10), n=%d",
			names[k], pct(res[k]["node prep"], 50)/pct(res[k]["runsc"], 50), n)
	}
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
// the API (client side, and ctld's own takeover_ms and reconcile_ms from
// its log), with no sandboxes and with N live ones (CTLD_BENCH_SANDBOXES,
// default 50; goal <= 300 ms), CTLD_BENCH_FAILOVERS rounds (default 30)
// each, on an empty journal and on one with 10,000 finished generations;
// it checks a guest still answers and every guest is still leased after
// each takeover.
// Run: make bench VM_PKGS=./test/e2e BENCH=Failover VM_MEM=8192
func BenchmarkFailover(b *testing.B) {
	guests := envInt("CTLD_BENCH_SANDBOXES", 50)
	rounds := envInt("CTLD_BENCH_FAILOVERS", 30)
	hist := envInt("CTLD_BENCH_HISTORY", 10000)
	const baseRounds = 5
	names := []string{"empty", fmt.Sprintf("%d finished", hist)}
	res := []series{{}, {}}
	for k := range names {
		e := newDiskEnv(b)
		if k == 1 {
			e.seedHistory(hist)
		}
		failoverRounds(b, e, names[k], guests, baseRounds, rounds, res[k])
		e.releaseAll()
		for slot := range e.procs {
			e.stop(slot)
		}
	}
	for _, m := range []string{"client", "takeover_ms", "reconcile_ms"} {
		for _, live := range []string{"0 live", fmt.Sprintf("%d live", guests)} {
			key := m + "/" + live
			e, f := res[0][key], res[1][key]
			if len(e) == 0 || len(f) == 0 {
				continue
			}
			b.Logf("failover %-12s %-8s empty p50 %7.0f p99 %7.0f ms (n=%d) | %s p50 %7.0f p99 %7.0f ms (n=%d) | ratio p50 %.2f p99 %.2f",
				m, live, pct(e, 50), pct(e, 99), len(e), names[1], pct(f, 50), pct(f, 99), len(f), pct(f, 50)/pct(e, 50), pct(f, 99)/pct(e, 99))
		}
	}
	for k := range names {
		base, live := res[k]["client/0 live"], res[k][fmt.Sprintf("client/%d live", guests)]
		b.Logf("%s journal: ratio %d live / 0 live at p50: %.2f (goal: %d live <= 300 ms)", names[k], guests, pct(live, 50)/pct(base, 50), guests)
	}
}

func failoverRounds(b *testing.B, e *env, name string, guests, baseRounds, rounds int, res series) {
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	e.start("b")
	e.waitRole("b", ha.RoleStandby, time.Minute)
	c := e.client()
	primary, standby := "a", "b"
	failover := func(live string) {
		start := time.Now()
		e.kill9(primary)
		e.waitPrimary(standby, 2*time.Minute)
		d := time.Since(start)
		e.start(primary) // rejoins as standby
		e.waitRole(primary, ha.RoleStandby, time.Minute)
		primary, standby = standby, primary
		res.add("client/"+live, float64(d.Microseconds())/1000)
		fmt.Fprintf(os.Stderr, "bench: %s journal, %s: failover to ctld@%s in %v\n", name, live, standby, d.Round(time.Millisecond))
	}
	for i := 0; i < baseRounds; i++ {
		failover("0 live")
	}

	// Share the allocatable CPU: ctld does not overcommit, and the lease's
	// cpu.max throttles the guest's boot too.
	node, err := c.Node(ctx(b, time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	cpu := max(node.Capacity.Allocatable.CPUMillis/int64(guests), 10)
	req := func(i int) api.ClaimRequest {
		r := claimReq(fmt.Sprintf("claim-fo%d", i), 1)
		r.Resources = api.Resources{CPUMillis: cpu, MemoryBytes: 96 << 20, PIDs: 64}
		return r
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	errs := make(chan error, guests)
	t0 := time.Now()
	for i := 0; i < guests; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			t := time.Now()
			_, err := c.Claim(ctx(b, 10*time.Minute), fmt.Sprintf("fo%d", i), req(i))
			fmt.Fprintf(os.Stderr, "bench: %s journal: claim fo%d: %v in %v\n", name, i, err, time.Since(t).Round(time.Millisecond))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatalf("%s journal: claim: %v", name, err)
		}
	}
	fmt.Fprintf(os.Stderr, "bench: %s journal: %d sandboxes of %dm CPU, 96 MiB claimed in %v\n", name, guests, cpu, time.Since(t0).Round(time.Second))

	live := fmt.Sprintf("%d live", guests)
	for i := 0; i < rounds; i++ {
		failover(live)
		cx := ctx(b, time.Minute)
		id := fmt.Sprintf("fo%d", i%guests)
		r, err := c.Exec(cx, id, api.ExecRequest{Args: []string{"/bin/echo", "alive"}})
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "alive" {
			b.Fatalf("%s journal: guest %s after failover: %q, %v", name, id, r.Stdout, err)
		}
		n, err := c.Node(cx)
		if err != nil {
			b.Fatal(err)
		}
		if n.Capacity.Leased.CPUMillis != cpu*int64(guests) {
			b.Fatalf("%s journal: after failover %dm leased, want %d guests x %dm", name, n.Capacity.Leased.CPUMillis, guests, cpu)
		}
	}
	takeoverLogs(e, guests, res)
	e.dumpLogs("msg=reconciled")
}

// takeoverLogs adds ctld's own takeover_ms and reconcile_ms of every
// takeover in the env's logs, keyed by how many generations it adopted.
func takeoverLogs(e *env, guests int, res series) {
	logs, _ := filepath.Glob(filepath.Join(filepath.Dir(e.stateDir), "ctld-*.log"))
	num := func(line, key string) (float64, bool) {
		m := regexp.MustCompile(`\b` + key + `=(\d+)`).FindStringSubmatch(line)
		if m == nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(m[1], 64)
		return v, err == nil
	}
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		adopted := -1.0
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := num(line, "adopted"); ok && strings.Contains(line, "msg=reconciled") {
				adopted = v
			}
			live := ""
			switch adopted {
			case 0:
				live = "0 live"
			case float64(guests):
				live = fmt.Sprintf("%d live", guests)
			default:
				continue
			}
			if v, ok := num(line, "reconcile_ms"); ok && strings.Contains(line, "primary: reconciled") {
				res.add("reconcile_ms/"+live, v)
			}
			if v, ok := num(line, "takeover_ms"); ok {
				res.add("takeover_ms/"+live, v)
				adopted = -1
			}
		}
	}
}
