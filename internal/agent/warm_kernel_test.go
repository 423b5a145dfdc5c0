package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/ktest"
)

// guestProcs lists the guest's processes as guest root sees them through
// the agent: pid → cmdline (NULs as spaces).
func guestProcs(t testing.TB, ctx context.Context, c *client.Client) map[int]string {
	t.Helper()
	root := &wire.User{}
	ents, err := c.List(ctx, "/proc", root)
	if err != nil {
		t.Fatalf("list guest /proc: %v", err)
	}
	out := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name)
		if err != nil {
			continue
		}
		var b bytes.Buffer
		if _, err := c.ReadFile(ctx, "/proc/"+e.Name+"/cmdline", root, 4096, &b); err != nil {
			continue // gone since the listing
		}
		out[pid] = strings.TrimSpace(strings.ReplaceAll(b.String(), "\x00", " "))
	}
	return out
}

// TestKernelWarmClaim boots a warm member (runsc, ctl-agent --warm as
// init, no workload) and claims it: the claim's command runs as the
// claim's user with exactly the claim's env in the claim's cwd, the
// agent answers the claim's nonce, and nothing from before the claim is
// in the guest but the agent and the workload's process it forked at
// boot, which became the workload (no other process, no nonce file, the
// boot nonce nowhere). Logs the idle member's memory and the claim's time
// against the member's own create+start+ready.
func TestKernelWarmClaim(t *testing.T) {
	ktest.Require(t)
	ktest.RequireBinary(t, "runsc")
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	const boot = "member-n0nce-1"
	g := startGuest(t, guestOpts{id: "agent-warm", nonce: boot, bin: agentBinary(t), warm: true})
	if got := g.waitReady(t); got != boot {
		t.Fatalf("member ready = %q, want its boot nonce", got)
	}
	booted := time.Since(g.created)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The agent as pid 1 and the workload's process it forked at boot,
	// waiting for the claim with no environment.
	idle := guestProcs(t, ctx, g.c)
	pre := ""
	for pid, cmd := range idle {
		if pid != 1 && cmd == "ctl-agent --exec-helper --drop-sys-admin" {
			pre = strconv.Itoa(pid)
		}
	}
	if len(idle) != 2 || !strings.Contains(idle[1], "ctl-agent --warm") || pre == "" {
		t.Fatalf("idle member's processes = %v, want the agent as pid 1 and its pre-forked workload", idle)
	}
	var preEnv bytes.Buffer
	if _, err := g.c.ReadFile(ctx, "/proc/"+pre+"/environ", &wire.User{}, 1<<16, &preEnv); err != nil || preEnv.Len() != 0 {
		t.Fatalf("the pre-forked workload's environ = %q, %v; want none", preEnv.String(), err)
	}
	mem, err := os.ReadFile(filepath.Join(g.cgroup, "memory.current"))
	if err != nil {
		t.Fatal(err)
	}

	const nonce = "claim-n0nce-7"
	u := wire.User{UID: 1234, GID: 1234}
	env := []string{"PATH=/bin:/usr/bin", "GREETING=hello warm", "EMPTY="}
	// The workload says its own cwd (gVisor's ptrace scope keeps others
	// from reading /proc/<pid>/cwd); its shell's environ is what the agent
	// gave it (the shell adds PWD and SHLVL to its children's only).
	const workload = "pwd > /tmp/cwd-seen; sleep 100000; true" // not exec'd: the shell stays
	t0 := time.Now()
	got, err := g.c.Claim(ctx, client.ClaimRequest{Nonce: nonce, User: u, Args: []string{"sh", "-c", workload}, Env: env, Cwd: "/tmp", Hostname: "claimed-box"})
	claimed := time.Since(t0)
	if err != nil || got != nonce {
		t.Fatalf("claim = %q, %v; want the claim's nonce", got, err)
	}
	if got, err := g.c.Ready(ctx); err != nil || got != nonce {
		t.Fatalf("ready after the claim = %q, %v", got, err)
	}
	var procs map[int]string
	var w string
	for t1 := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		procs = guestProcs(t, ctx, g.c)
		w = ""
		sleeping := false
		for pid, cmd := range procs {
			switch {
			case pid == 1:
			case cmd == "sh -c "+workload:
				w = strconv.Itoa(pid)
			case cmd == "sleep 100000":
				sleeping = true
			default:
				t.Fatalf("guest process %d %q: not the agent, not the workload's (all: %v)", pid, cmd, procs)
			}
		}
		if w != "" && sleeping && len(procs) == 3 {
			break
		}
		if time.Since(t1) > time.Minute {
			t.Fatalf("guest processes after the claim = %v, want the agent and the workload's shell and sleep", procs)
		}
	}
	if w != pre {
		t.Errorf("the workload is pid %s, want the pre-forked %s", w, pre)
	}
	var environ bytes.Buffer
	if _, err := g.c.ReadFile(ctx, "/proc/"+w+"/environ", &wire.User{}, 1<<16, &environ); err != nil {
		t.Fatal(err)
	}
	if gotEnv := strings.Split(strings.TrimSuffix(environ.String(), "\x00"), "\x00"); !slices.Equal(gotEnv, env) {
		t.Errorf("workload env = %q, want exactly the claim's %q", gotEnv, env)
	}
	var cwd bytes.Buffer
	if _, err := g.c.ReadFile(ctx, "/tmp/cwd-seen", &wire.User{}, 4096, &cwd); err != nil || cwd.String() != "/tmp\n" {
		t.Errorf("workload's cwd = %q, %v; want the claim's /tmp", cwd.String(), err)
	}
	sh := func(u *wire.User, script string) string {
		var out, errb bytes.Buffer
		e, err := g.c.Exec(ctx, client.ExecRequest{Args: []string{"sh", "-c", script}, User: u}, client.Streams{Stdout: &out, Stderr: &errb})
		if err != nil || e.Code != 0 {
			t.Fatalf("exec %q: %+v, %v, %q", script, e, err, errb.String())
		}
		return strings.TrimSpace(out.String())
	}
	root := &wire.User{}
	if got := sh(root, "stat -c '%u:%g' /proc/"+w); got != "1234:1234" {
		t.Errorf("workload's owner = %q, want the claim's 1234:1234", got)
	}
	// An exec that names no user runs as the claim's.
	if got := sh(nil, "id -u; id -g"); got != "1234\n1234" {
		t.Errorf("default exec user = %q, want the claim's 1234", got)
	}
	if got := sh(nil, "hostname"); got != "claimed-box" {
		t.Errorf("hostname = %q, want the claim's", got)
	}
	// CAP_SYS_ADMIN (bit 21), the member's for the hostname alone, is in
	// no bounding set after the claim: not the agent's, the workload's or
	// a root exec's.
	for _, p := range []string{"/proc/1/status", "/proc/" + w + "/status", "/proc/self/status"} {
		line := sh(root, "grep CapBnd "+p)
		f := strings.Fields(line)
		v, err := strconv.ParseUint(f[len(f)-1], 16, 64)
		if err != nil || v&(1<<21) != 0 {
			t.Errorf("%s: %q (%v): CAP_SYS_ADMIN still bounding", p, line, err)
		}
	}
	// The boot nonce and the claim's are in no file a guest reads.
	for _, p := range []string{"/proc/1/environ", "/proc/1/cmdline", "/proc/" + w + "/environ"} {
		var b bytes.Buffer
		g.c.ReadFile(ctx, p, root, 1<<16, &b)
		if s := b.String(); strings.Contains(s, boot) || strings.Contains(s, nonce) {
			t.Errorf("%s holds a nonce: %q", p, s)
		}
	}
	// (Listed through the agent: busybox ls stats the host socket, which
	// gVisor refuses.)
	ents, err := g.c.List(ctx, "/.ctl", root)
	if err != nil {
		t.Fatalf("list /.ctl: %v", err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name, "nonce") {
			t.Errorf("/.ctl after the claim holds %q: the boot nonce file is still there", e.Name)
		}
	}
	if _, err := g.c.Claim(ctx, client.ClaimRequest{Nonce: "again", User: u, Args: []string{"true"}}); err == nil {
		t.Errorf("a second claim on the member was taken: single use broken")
	}
	t.Logf("warm member: create+start+ready %v, idle memory.current %s bytes; claim (workload start + nonce) %v: %.3fx",
		booted.Round(time.Millisecond), strings.TrimSpace(string(mem)), claimed.Round(time.Millisecond), float64(claimed)/float64(booted))
}

// BenchmarkWarmVsColdClaim measures, alternating in one run, the guest
// side of a claim of the same spec (busybox root, `sleep` as uid 1000):
//   - cold: runsc create + start of a guest whose init is the agent with
//     the workload, until the agent answers the nonce;
//   - warm: on a member booted ahead (untimed: the pool's work), the one
//     claim call that starts the workload and answers the claim's nonce.
//
// It reports p50/p99 of each, warm/cold at both, and the memory of an
// idle member (memory.current of its cgroup: sentry, gofer, agent).
// ctld's own steps (journal, lease, root, network) are not in either.
// In the test VM: make bench VM_PKGS=./internal/agent BENCH=WarmVsColdClaim
// (CTLD_BENCH_CLAIMS rounds, default 8).
func BenchmarkWarmVsColdClaim(b *testing.B) {
	ktest.RequireBinary(b, "runsc")
	ktest.RequireCgroup2(b, "cpu", "memory", "pids")
	bin := agentBinary(b)
	n := 8
	if v, err := strconv.Atoi(os.Getenv("CTLD_BENCH_CLAIMS")); err == nil && v > 0 {
		n = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	u := wire.User{UID: 1000, GID: 1000}
	var cold, warm, proof []time.Duration
	var boots []wire.BootReport
	var claims []wire.ClaimReport
	var mems []int64
	for i := range n {
		// The member is booted before the cold claim starts and claimed
		// after it: both see the same machine, neither the other's boot.
		m := startGuest(b, guestOpts{id: fmt.Sprintf("warm-%d", i), nonce: "member", bin: bin, warm: true})
		if got := m.waitReady(b); got != "member" {
			b.Fatalf("member ready = %q", got)
		}
		mb, err := os.ReadFile(filepath.Join(m.cgroup, "memory.current"))
		if err != nil {
			b.Fatal(err)
		}
		mem, _ := strconv.ParseInt(strings.TrimSpace(string(mb)), 10, 64)
		mems = append(mems, mem)

		c := startGuest(b, guestOpts{id: fmt.Sprintf("cold-%d", i), nonce: "cold", bin: bin})
		if got := c.waitReady(b); got != "cold" {
			b.Fatalf("cold ready = %q", got)
		}
		cold = append(cold, time.Since(c.created))
		proof = append(proof, time.Since(c.started))
		boots = append(boots, readReport[wire.BootReport](b, c, wire.BootReportName))

		t0 := time.Now()
		got, err := m.c.Claim(ctx, client.ClaimRequest{Nonce: "warm", User: u, Args: []string{"sleep", "100000"}, Env: []string{"A=1"}, Cwd: "/"})
		warm = append(warm, time.Since(t0))
		if err != nil || got != "warm" {
			b.Fatalf("warm claim = %q, %v", got, err)
		}
		claims = append(claims, readReport[wire.ClaimReport](b, m, wire.ClaimReportName))
		// Each pair's guests go before the next pair (their cleanups run at
		// the end otherwise, and 2n guests would share the VM).
		for _, g := range []*guest{c, m} {
			if err := g.r.Delete(ctx, g.id); err != nil {
				b.Fatalf("delete %s: %v", g.id, err)
			}
		}
	}
	pct := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	c50, c99, w50, w99 := pct(cold, 0.5), pct(cold, 0.99), pct(warm, 0.5), pct(warm, 0.99)
	slices.Sort(mems)
	fmt.Fprintf(os.Stdout, "warm vs cold claim (guest side, n=%d): cold p50 %v p99 %v; warm p50 %v p99 %v; warm/cold p50 %.4f p99 %.4f; idle member memory p50 %d KiB (min %d, max %d)\n",
		n, c50.Round(time.Millisecond), c99.Round(time.Millisecond), w50.Round(time.Microsecond), w99.Round(time.Microsecond),
		float64(w50)/float64(c50), float64(w99)/float64(c99), mems[len(mems)/2]>>10, mems[0]>>10, mems[len(mems)-1]>>10)
	// Where a cold guest's readiness goes (the agent's own clock): its
	// process start to Main, Main to listening, then the workload's start.
	fmt.Fprintf(os.Stdout, "cold readiness (runsc start returned to the agent's answer) p50 %v; the agent's boot p50: runtime start-up %.0f ms, to listening %.0f ms, workload fork+exec %.0f ms\n",
		pct(proof, 0.5).Round(time.Millisecond), p50Of(boots, func(r wire.BootReport) float64 { return r.RuntimeMS }),
		p50Of(boots, func(r wire.BootReport) float64 { return r.ListenMS }), p50Of(boots, func(r wire.BootReport) float64 { return r.StartMS }))
	fmt.Fprintf(os.Stdout, "warm claim call p50 %v; in the agent p50: hostname and capability drop %.0f ms, workload start %.0f ms (pre-forked: %v); the rest is the round trip\n",
		w50.Round(time.Millisecond), p50Of(claims, func(r wire.ClaimReport) float64 { return r.HostnameMS }),
		p50Of(claims, func(r wire.ClaimReport) float64 { return r.StartMS }), claims[0].Preforked)
	b.ReportMetric(float64(w50)/float64(c50), "warm/cold-p50")
	b.ReportMetric(float64(w99)/float64(c99), "warm/cold-p99")
	b.ReportMetric(float64(mems[len(mems)/2]), "idle-member-bytes")
}

// p50Of is the median of f over rs.
func p50Of[R any](rs []R, f func(R) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// readReport reads the report (wire.BootReportName, ClaimReportName) a
// guest's agent left beside its socket (it writes it right after its
// answer).
func readReport[R any](t testing.TB, g *guest, name string) R {
	t.Helper()
	path := filepath.Join(filepath.Dir(g.c.Socket), name)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(path)
		if err == nil {
			var r R
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("%s report %q: %v", name, b, err)
			}
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s report from %s: %v", name, g.id, err)
		}
	}
}
