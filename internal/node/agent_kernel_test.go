package node

import (
	"context"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelAgentInGeneration: on the real kernel, every generation's init
// is the guest agent. A claim whose workload runs as uid 1000 is ready
// through the agent's answer, also on a root without /bin/echo; exec runs
// as the workload's user by default and as root when asked; a file
// written through the node is the guest's own (owned by uid 1000) and
// reads back; after a takeover the adopted generation's agent answers;
// release leaves nothing (the agent dirs included).
func TestKernelAgentInGeneration(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	k.noReuse = true
	r := newRig(t, k)
	r.mustBoot()
	ctx := context.Background()
	exec := func(id string, user *api.User, script string) string {
		t.Helper()
		var out, errb strings.Builder
		code, err := r.n.Exec(ctx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", script}, User: user}, &out, &errb)
		if err != nil || code != 0 {
			t.Fatalf("exec %q in %s as %+v: %d, %v, stderr %q", script, id, user, code, err, errb.String())
		}
		return strings.TrimSpace(out.String())
	}
	for _, tmpl := range []string{"busybox", "noecho"} {
		id := "agent-" + tmpl
		req := claimReq("c-"+tmpl, 1)
		req.RootFS.Template = tmpl
		req.Process = api.Process{UID: 1000, GID: 1000}
		resp := r.mustClaim(id, req)
		tm := resp.Sandbox.Timings
		t.Logf("%s: claim total %.0f ms, runsc %.0f ms, readiness (agent ready) %.0f ms", tmpl, tm.TotalMS, tm.RunscMS, tm.ProofMS)
		if got := exec(id, nil, "id -u; id -g"); got != "1000\n1000" {
			t.Errorf("%s: exec as the workload's user: %q, want 1000 1000", tmpl, got)
		}
		if got := exec(id, &api.User{UID: 0, GID: 0}, "id -u"); got != "0" {
			t.Errorf("%s: exec as root: %q", tmpl, got)
		}
		// The workload itself runs as uid 1000, a child of the agent (pid 1).
		if got := exec(id, &api.User{}, "ps -o user,ppid,args | grep '^1000 .*/bin/[s]leep'"); !strings.HasPrefix(got, "1000") || !strings.Contains(got, " 1 ") {
			t.Errorf("%s: workload: %q, want uid 1000 with parent 1", tmpl, got)
		}
		if tmpl == "noecho" {
			if got := exec(id, nil, "test -e /bin/echo && echo has-echo || echo no-echo"); got != "no-echo" {
				t.Errorf("noecho template has /bin/echo: %q", got)
			}
		}
		if err := r.n.WriteFile(ctx, id, "/tmp/from-host", []byte("hello guest")); err != nil {
			t.Fatalf("%s: write file: %v", tmpl, err)
		}
		if b, err := r.n.ReadFile(ctx, id, "/tmp/from-host", 1<<20); err != nil || string(b) != "hello guest" {
			t.Fatalf("%s: read back: %q, %v", tmpl, b, err)
		}
		if got := exec(id, nil, "stat -c %u /tmp/from-host; cat /tmp/from-host"); got != "1000\nhello guest" {
			t.Errorf("%s: the guest's view of the written file: %q", tmpl, got)
		}
	}
	// A takeover: the next term adopts both generations and reaches their
	// agents from the journal alone.
	r.mustBoot()
	if got := exec("agent-busybox", nil, "id -u"); got != "1000" {
		t.Errorf("exec on the adopted generation: %q", got)
	}
	if b, err := r.n.ReadFile(ctx, "agent-noecho", "/tmp/from-host", 1<<20); err != nil || string(b) != "hello guest" {
		t.Errorf("read on the adopted generation: %q, %v", b, err)
	}
	r.mustRelease("agent-busybox", "r1", 1)
	r.mustRelease("agent-noecho", "r2", 1)
	r.checkProof("r1")
	r.checkProof("r2")
	r.checkClean("after release")
	checkUnjournaled(r, crashCase{})
}
