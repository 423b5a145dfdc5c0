package agent_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
)

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestKernelAgentAsRunscInit runs ctl-agent as the init of a real runsc
// container (busybox root, workload uid 1000) with --host-uds=create and
// its socket directory bind-mounted, and calls it from the host: the
// nonce, `id -u` as the workload's user, as uid 1000 and as root. Then it
// measures an exec round trip through the agent against `runsc exec` of
// the same command on the same guest.
func TestKernelAgentAsRunscInit(t *testing.T) {
	ktest.Require(t)
	ktest.RequireBinary(t, "runsc")
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	const nonce = "n0nce-4f2a"
	g := startGuest(t, guestOpts{id: "agent-init", nonce: nonce, bin: agentBinary(t)})
	c, r, id := g.c, g.r, g.id
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if got := g.waitReady(t); got != nonce {
		t.Fatalf("ready = %q, want %q", got, nonce)
	}
	idU := func(u *wire.User) string {
		var out, errb bytes.Buffer
		e, err := c.Exec(ctx, client.ExecRequest{Args: []string{"id", "-u"}, User: u}, client.Streams{Stdout: &out, Stderr: &errb})
		if err != nil || e.Code != 0 {
			t.Fatalf("id -u as %+v: %+v, %v, stderr %q", u, e, err, errb.String())
		}
		return strings.TrimSpace(out.String())
	}
	for _, tc := range []struct {
		u    *wire.User
		want string
	}{{nil, "1000"}, {&wire.User{UID: 1000, GID: 1000}, "1000"}, {&wire.User{UID: 0, GID: 0}, "0"}} {
		if got := idU(tc.u); got != tc.want {
			t.Errorf("id -u as %+v = %q, want %s", tc.u, got, tc.want)
		}
	}
	// The workload (sleep) is the agent's child, running as uid 1000.
	var ps bytes.Buffer
	c.Exec(ctx, client.ExecRequest{Args: []string{"ps", "-o", "pid,ppid,user,args"}, User: &wire.User{}}, client.Streams{Stdout: &ps})
	t.Logf("guest processes:\n%s", ps.String())
	// The nonce is not in the agent's environ or cmdline (gVisor serves
	// both to every guest user), nor in its file, which the agent removed
	// before it listened: not for uid 1000, not for guest root.
	for _, u := range []*wire.User{nil, {}} {
		for _, p := range []string{"/proc/1/environ", "/proc/1/cmdline", "/.ctl/nonce"} {
			var out bytes.Buffer
			e, err := c.Exec(ctx, client.ExecRequest{Args: []string{"cat", p}, User: u}, client.Streams{Stdout: &out, Stderr: io.Discard})
			if err != nil || strings.Contains(out.String(), nonce) {
				t.Errorf("%+v reading %s: %+v, %v, %q; want no nonce", u, p, e, err, out.String())
			}
		}
	}
	// A file written by the host through the agent, as uid 1000, in the
	// guest's own view (its home is /tmp here: gVisor's own tmpfs).
	if _, err := c.WriteFile(ctx, "/tmp/hello", nil, 0o644, 0, strings.NewReader("hi from the host")); err != nil {
		t.Fatalf("write file as uid 1000: %v", err)
	}
	var cat bytes.Buffer
	if e, err := c.Exec(ctx, client.ExecRequest{Args: []string{"sh", "-c", "cat /tmp/hello; stat -c %u /tmp/hello"}}, client.Streams{Stdout: &cat}); err != nil || e.Code != 0 || cat.String() != "hi from the host1000\n" {
		t.Errorf("guest view of the written file: %q, %+v, %v", cat.String(), e, err)
	}

	// Benchmark: exec round trip of /bin/echo hi, agent vs runsc exec.
	const nAgent, nRunsc = 50, 10
	var viaAgent, viaRunsc []time.Duration
	for range nAgent {
		var out bytes.Buffer
		t0 := time.Now()
		e, err := c.Exec(ctx, client.ExecRequest{Args: []string{"/bin/echo", "hi"}}, client.Streams{Stdout: &out})
		viaAgent = append(viaAgent, time.Since(t0))
		if err != nil || e.Code != 0 || out.String() != "hi\n" {
			t.Fatalf("agent echo: %q %+v %v", out.String(), e, err)
		}
	}
	for range nRunsc {
		var out bytes.Buffer
		t0 := time.Now()
		code, err := r.Exec(ctx, id, runsc.ExecProcess{Args: []string{"/bin/echo", "hi"}, UID: 1000, GID: 1000}, nil, &out, io.Discard)
		viaRunsc = append(viaRunsc, time.Since(t0))
		if err != nil || code != 0 || out.String() != "hi\n" {
			t.Fatalf("runsc exec echo: %q %d %v", out.String(), code, err)
		}
	}
	a, rs := p50(viaAgent), p50(viaRunsc)
	t.Logf("exec round trip of /bin/echo hi: agent p50 %v (n=%d, max %v), runsc exec p50 %v (n=%d, max %v): runsc/agent = %.0fx",
		a, nAgent, slices.Max(viaAgent), rs, nRunsc, slices.Max(viaRunsc), float64(rs)/float64(a))
}
