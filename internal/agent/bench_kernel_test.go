package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
)

// BenchmarkExecVsRunsc measures, on one guest whose init is ctl-agent,
// interleaved so that every series sees the same machine:
//   - an exec round trip of /bin/true through the agent and through
//     `runsc exec` (issue 11's goal: agent/runsc <= 0.05 at p50 and p99);
//   - `ready` (no fork) against today's readiness step, `runsc exec
//     /bin/echo <nonce>` (goal <= 0.1), first right after start (cold:
//     what a claim sees) and then warm;
//   - the floor inside the guest: the gVisor sentry's fork+exec+wait of
//     /bin/true, from (loop of K runs - empty loop)/K in a guest shell.
//
// In the test VM: make bench VM_PKGS=./internal/agent BENCH=ExecVsRunsc.
// On a host where runsc runs (root; --network=none, --ignore-cgroups):
// go test -run '^$' -bench ExecVsRunsc -benchtime 1x ./internal/agent.
// CTLD_BENCH_EXECS rounds (default 40).
func BenchmarkExecVsRunsc(b *testing.B) {
	host := !ktest.Asked()
	var bin string
	if host {
		if ok, why := hostRunsc(); !ok {
			b.Skipf("host run needs runsc as root (%s); in the VM: make bench VM_PKGS=./internal/agent BENCH=ExecVsRunsc", why)
		}
		bin = filepath.Join(b.TempDir(), "ctl-agent")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/ctld/ctld/cmd/ctl-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("build ctl-agent: %v\n%s", err, out)
		}
	} else {
		ktest.RequireBinary(b, "runsc")
		ktest.RequireCgroup2(b, "cpu", "memory", "pids")
		bin = agentBinary(b)
	}
	n := 40
	if v, err := strconv.Atoi(os.Getenv("CTLD_BENCH_EXECS")); err == nil && v > 0 {
		n = v
	}
	const nonce = "bench-n0nce"
	g := startGuest(b, guestOpts{id: "agent-bench", nonce: nonce, bin: bin, host: host})
	if got := g.waitReady(b); got != nonce {
		b.Fatalf("ready = %q, want %q", got, nonce)
	}
	sinceStart := time.Since(g.started)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	ready := func() time.Duration {
		t0 := time.Now()
		got, err := g.c.Ready(ctx)
		d := time.Since(t0)
		if err != nil || got != nonce {
			b.Fatalf("ready: %q, %v", got, err)
		}
		return d
	}
	agentExec := func(args ...string) time.Duration {
		var out bytes.Buffer
		t0 := time.Now()
		e, err := g.c.Exec(ctx, client.ExecRequest{Args: args}, client.Streams{Stdout: &out, Stderr: &out})
		d := time.Since(t0)
		if err != nil || e.Code != 0 {
			b.Fatalf("agent exec %q: %+v, %v, %q", args, e, err, out.String())
		}
		return d
	}
	runscExec := func(args ...string) (time.Duration, string) {
		var out bytes.Buffer
		t0 := time.Now()
		code, err := g.r.Exec(ctx, g.id, runsc.ExecProcess{Args: args, UID: 1000, GID: 1000}, nil, &out, io.Discard)
		d := time.Since(t0)
		if err != nil || code != 0 {
			b.Fatalf("runsc exec %q: %d, %v", args, code, err)
		}
		return d, out.String()
	}
	s := map[string][]time.Duration{}
	add := func(k string, d time.Duration) { s[k] = append(s[k], d) }

	// Cold: what a claim's readiness step sees right after start (the
	// sentry's clocks are not calibrated yet: every clock_gettime of the
	// guest traps into it).
	for range 5 {
		add("ready cold", ready())
		d, out := runscExec("/bin/echo", nonce)
		if out != nonce+"\n" {
			b.Fatalf("runsc exec echo: %q", out)
		}
		add("runsc echo cold", d)
	}
	// Warm up past the calibration (gVisor logs it about a second after
	// start on the build machine).
	for t0 := time.Now(); time.Since(t0) < 3*time.Second; {
		ready()
		time.Sleep(20 * time.Millisecond)
	}
	const loop = 20
	shLoop := func(k int) string {
		return fmt.Sprintf("i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done", k)
	}
	for i := range n {
		add("ready", ready())
		add("agent exec", agentExec("/bin/true"))
		d, _ := runscExec("/bin/true")
		add("runsc exec", d)
		d, _ = runscExec("/bin/echo", nonce)
		add("runsc echo", d)
		if i%4 == 0 {
			// The floor: fork+exec+wait inside the guest, per run.
			full, empty := agentExec("/bin/sh", "-c", shLoop(loop)), agentExec("/bin/sh", "-c", shLoop(0))
			add("guest fork+exec", (full-empty)/loop)
		}
	}
	pc := func(k string, p int) time.Duration {
		v := slices.Clone(s[k])
		slices.Sort(v)
		i := (len(v)*p + 99) / 100
		if i > 0 {
			i--
		}
		return v[i]
	}
	where := "test VM (TCG, ptrace)"
	if host {
		where = "host (ptrace, --network=none)"
	}
	b.Logf("%s; agent first answered %v after runsc start; n=%d rounds", where, sinceStart.Round(time.Millisecond), n)
	for _, k := range []string{"ready cold", "runsc echo cold", "ready", "agent exec", "runsc exec", "runsc echo", "guest fork+exec"} {
		b.Logf("%-16s p50 %9.3f ms  p99 %9.3f ms  (n=%d)", k, ms(pc(k, 50)), ms(pc(k, 99)), len(s[k]))
	}
	r := func(a, c string, p int) float64 { return ms(pc(a, p)) / ms(pc(c, p)) }
	b.Logf("exec /bin/true agent/runsc: p50 %.3f p99 %.3f (goal <= 0.05)", r("agent exec", "runsc exec", 50), r("agent exec", "runsc exec", 99))
	b.Logf("readiness ready/runsc exec echo: cold p50 %.3f, warm p50 %.3f p99 %.3f (goal <= 0.1); the agent's first answer came %.3fx of a cold runsc exec echo after start (polled every 20 ms)",
		r("ready cold", "runsc echo cold", 50), r("ready", "runsc echo", 50), r("ready", "runsc echo", 99), ms(sinceStart)/ms(pc("runsc echo cold", 50)))
	b.Logf("floor: guest fork+exec+wait/runsc exec p50 %.3f; agent exec - ready - floor = %.3f ms at p50 (the agent's own share)",
		r("guest fork+exec", "runsc exec", 50), ms(pc("agent exec", 50)-pc("ready", 50)-pc("guest fork+exec", 50)))
	b.ReportMetric(r("agent exec", "runsc exec", 50), "agent/runsc-p50")
	b.ReportMetric(r("agent exec", "runsc exec", 99), "agent/runsc-p99")
	b.ReportMetric(r("ready", "runsc echo", 50), "ready/runsc-echo-p50")
	b.ReportMetric(r("guest fork+exec", "runsc exec", 50), "floor/runsc-p50")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkAgentStart measures a claim's readiness step without ctld: for
// each of n fresh guests whose init is ctl-agent (workload `sleep`), the
// time from `runsc start` returning to the agent's first answer to
// `ready`, polled every 5 ms as ctld polls (internal/node's readyPoll), then a `runsc
// exec /bin/echo <nonce>` on the same guest (the old readiness step, run
// right after: still cold). p50/p99 of each and their ratio.
// CTLD_BENCH_AGENT_ENVS compares variants of the agent's environment in
// the same run, interleaved guest by guest: variants split by ";", each
// a space-separated KEY=VALUE list ("" the default), e.g.
// ";GOMAXPROCS=1;GOGC=off". A BIN=PATH in a variant runs that binary as
// the init instead of the agent: the floor, e.g. the stubs of
// testdata/initfloor (a static C and a Go init that answer `ready` only);
// NOWORKLOAD runs the agent without a workload.
//
// In the test VM: make bench VM_PKGS=./internal/agent BENCH=AgentStart.
// On a host where runsc runs as root:
// go test -run '^$' -bench AgentStart -benchtime 1x ./internal/agent.
// CTLD_BENCH_STARTS guests per variant (default 5).
func BenchmarkAgentStart(b *testing.B) {
	host := !ktest.Asked()
	bin := benchAgentBinary(b, host)
	n := 5
	if v, err := strconv.Atoi(os.Getenv("CTLD_BENCH_STARTS")); err == nil && v > 0 {
		n = v
	}
	variants := strings.Split(os.Getenv("CTLD_BENCH_AGENT_ENVS"), ";")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	toReady, echo, cpu := map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}
	for i := range n {
		// Each round starts at another variant: a guest may pay for the
		// teardown of the one before it, so no variant always follows the
		// same one.
		for k := range variants {
			vi := (i + k) % len(variants)
			v := variants[vi]
			nonce := fmt.Sprintf("start-n0nce-%d-%d", i, vi)
			vbin, env, noWork := bin, []string(nil), false
			for _, kv := range strings.Fields(v) {
				if p, ok := strings.CutPrefix(kv, "BIN="); ok {
					vbin = p
				} else if kv == "NOWORKLOAD" {
					noWork = true
				} else {
					env = append(env, kv)
				}
			}
			g := startGuest(b, guestOpts{id: fmt.Sprintf("agent-start-%d-%d", i, vi), nonce: nonce, bin: vbin, host: host, env: env, noWorkload: noWork})
			for {
				got, err := g.c.Ready(ctx)
				if err == nil {
					if got != nonce {
						b.Fatalf("ready = %q, want %q", got, nonce)
					}
					break
				}
				if time.Since(g.started) > 2*time.Minute {
					b.Fatalf("agent never answered: %v", err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			toReady[v] = append(toReady[v], time.Since(g.started))
			cpu[v] = append(cpu[v], g.cpu(b)-g.cpu0)
			var out bytes.Buffer
			t0 := time.Now()
			code, err := g.r.Exec(ctx, g.id, runsc.ExecProcess{Args: []string{"/bin/echo", nonce}, UID: 1000, GID: 1000}, nil, &out, io.Discard)
			echo[v] = append(echo[v], time.Since(t0))
			if err != nil || code != 0 || out.String() != nonce+"\n" {
				b.Fatalf("runsc exec echo: %q %d %v", out.String(), code, err)
			}
			if err := g.r.Delete(ctx, g.id); err != nil {
				b.Fatalf("delete guest: %v", err)
			}
		}
	}
	pc := func(v []time.Duration, p int) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		i := (len(v)*p + 99) / 100
		if i > 0 {
			i--
		}
		return ms(v[i])
	}
	where := "test VM (TCG, ptrace)"
	if host {
		where = "host (ptrace, --network=none)"
	}
	for _, v := range variants {
		r, e := toReady[v], echo[v]
		b.Logf("%s, agent env %q, n=%d guests: runsc start -> agent ready p50 %.0f ms p99 %.0f ms (all %v); runsc exec /bin/echo right after p50 %.0f ms p99 %.0f ms; ratio p50 %.2f p99 %.2f; the guest's CPU time from start to ready p50 %.0f ms p99 %.0f ms",
			where, v, n, pc(r, 50), pc(r, 99), r, pc(e, 50), pc(e, 99), pc(r, 50)/pc(e, 50), pc(r, 99)/pc(e, 99), pc(cpu[v], 50), pc(cpu[v], 99))
	}
	b.ReportMetric(pc(toReady[variants[0]], 50), "start-to-ready-p50-ms")
	b.ReportMetric(pc(echo[variants[0]], 50), "runsc-echo-p50-ms")
}

// benchAgentBinary is the agent the benchmarks run: the VM harness's, or
// on a host one built static for the run.
func benchAgentBinary(b *testing.B, host bool) string {
	if !host {
		ktest.RequireBinary(b, "runsc")
		ktest.RequireCgroup2(b, "cpu", "memory", "pids")
		return agentBinary(b)
	}
	if ok, why := hostRunsc(); !ok {
		b.Skipf("host run needs runsc as root (%s); in the VM: make bench VM_PKGS=./internal/agent", why)
	}
	bin := filepath.Join(b.TempDir(), "ctl-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/ctld/ctld/cmd/ctl-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build ctl-agent: %v\n%s", err, out)
	}
	return bin
}

// BenchmarkFileVsCat measures file throughput through the agent against
// the guest's own floor, on one guest, in one run (issue 11: "file
// read/write throughput of 1 GiB vs `cat` of the same file inside the
// guest"):
//   - write: the client streams CTLD_BENCH_FILE_BYTES (default 64 MiB)
//     into /tmp/f through the agent (ktest.Pattern); the floor is `cat /tmp/f > /tmp/g`
//     in the guest (the same bytes read and written by the sentry);
//   - read: the client reads /tmp/f back through the agent (checked
//     byte-identical against the pattern); the floor is `cat /tmp/f >
//     /dev/null`, and `cat /tmp/f | cat > /dev/null` (which surely reads).
//
// The floors are timed (best of 3 below 256 MiB) as an agent exec of `sh -c 'cat …'` minus one of
// `sh -c :` (the exec's own cost). The ratios are agent/cat throughput.
//
// In the test VM: make bench VM_PKGS=./internal/agent BENCH=FileVsCat
// CTLD_BENCH_FILE_BYTES=1073741824. On a host where runsc runs as root:
// go test -run '^$' -bench FileVsCat -benchtime 1x ./internal/agent.
func BenchmarkFileVsCat(b *testing.B) {
	host := !ktest.Asked()
	bin := benchAgentBinary(b, host)
	size := int64(64 << 20)
	if v, err := strconv.ParseInt(os.Getenv("CTLD_BENCH_FILE_BYTES"), 10, 64); err == nil && v > 0 {
		size = v
	}
	// The sentry keeps the guest's file pages in its memory (counted to
	// the guest's cgroup): room for the file and its copy.
	g := startGuest(b, guestOpts{id: "agent-file-bench", nonce: "file-n0nce", bin: bin, host: host, memory: 2*size + 512<<20})
	g.waitReady(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	mibs := func(d time.Duration) float64 { return float64(size) / d.Seconds() / (1 << 20) }
	sh := func(script string) time.Duration {
		var out bytes.Buffer
		t0 := time.Now()
		e, err := g.c.Exec(ctx, client.ExecRequest{Args: []string{"/bin/sh", "-c", script}}, client.Streams{Stdout: &out, Stderr: &out})
		d := time.Since(t0)
		if err != nil || e.Code != 0 {
			b.Fatalf("exec %q: %+v, %v, %q", script, e, err, out.String())
		}
		return d
	}

	t0 := time.Now()
	n, err := g.c.WriteFile(ctx, "/tmp/f", nil, 0o644, 0, &ktest.Pattern{N: size})
	agentWrite := time.Since(t0)
	if err != nil || n != size {
		b.Fatalf("agent write: %d bytes, %v", n, err)
	}

	// Each floor is the best of 3 for a small file (the exec's own cost
	// varies by more than its cat takes); one run from 256 MiB.
	best := func(script string) time.Duration {
		d := sh(script)
		for i := 1; i < 3 && size < 256<<20; i++ {
			d = min(d, sh(script))
		}
		return d
	}
	empty := best(":")
	catRead := best("cat /tmp/f > /dev/null") - empty
	// busybox cat sends a file with sendfile: to /dev/null it might not
	// read it at all; through a pipe every byte is read and moved.
	catPipe := best("cat /tmp/f | cat > /dev/null") - empty
	catWrite := best("cat /tmp/f > /tmp/g; rm /tmp/g") - empty

	check := &ktest.PatternCheck{N: size}
	t0 = time.Now()
	n, err = g.c.ReadFile(ctx, "/tmp/f", nil, 0, check)
	agentRead := time.Since(t0)
	if err != nil || n != size {
		b.Fatalf("agent read: %d bytes, %v", n, err)
	}
	if err := check.Err(); err != nil {
		b.Fatalf("read back: %v", err)
	}
	where := "test VM (TCG, ptrace)"
	if host {
		where = "host (ptrace, --network=none)"
	}
	b.Logf("%s, %d MiB, one run; in-guest exec of `sh -c :` %v (subtracted from the cat times)", where, size>>20, empty.Round(time.Millisecond))
	b.Logf("write: agent %v (%.1f MiB/s), guest `cat f > g` %v (%.1f MiB/s): agent/cat %.3f",
		agentWrite.Round(time.Millisecond), mibs(agentWrite), catWrite.Round(time.Millisecond), mibs(catWrite), mibs(agentWrite)/mibs(catWrite))
	b.Logf("read:  agent %v (%.1f MiB/s), guest `cat f > /dev/null` %v (%.1f MiB/s): agent/cat %.3f; guest `cat f | cat > /dev/null` %v (%.1f MiB/s): agent/that %.3f",
		agentRead.Round(time.Millisecond), mibs(agentRead), catRead.Round(time.Millisecond), mibs(catRead), mibs(agentRead)/mibs(catRead),
		catPipe.Round(time.Millisecond), mibs(catPipe), mibs(agentRead)/mibs(catPipe))
	b.ReportMetric(mibs(agentWrite), "agent-write-MiB/s")
	b.ReportMetric(mibs(agentRead), "agent-read-MiB/s")
	b.ReportMetric(mibs(agentWrite)/mibs(catWrite), "write-agent/cat")
	b.ReportMetric(mibs(agentRead)/mibs(catRead), "read-agent/cat")
	b.ReportMetric(mibs(agentRead)/mibs(catPipe), "read-agent/cat-pipe")
}
