package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/node/warm"
)

// TestKernelWarmPool: on the real kernel a node with a pool of one
// busybox member boots it (runsc with the warm agent, in a lease with the
// member's small limits); a claim takes it and is ready through the
// agent's claim; an exec works; nothing from before the claim is in the
// guest (its processes are the agent and the workload, the workload's
// environ is the claim's, the nonce file is gone, the hostname is the
// claim's); a second claim of the same spec, with the pool drained, is
// cold; both releases give clean proofs and nothing is left. It logs the
// warm and the cold claim's times.
func TestKernelWarmPool(t *testing.T) {
	k := warmKernel(t)
	r := newRig(t, k)
	t0 := time.Now()
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	t.Logf("member %s booted and idle %.1f s after the takeover began", m.Rec.ID, time.Since(t0).Seconds())
	if l := r.ledger(); l.Warm.MemoryBytes != 256<<20 || l.Leased != (Capacity{}) {
		t.Errorf("ledger with one idle member: warm %+v, leased %+v", l.Warm, l.Leased)
	}
	ctx := context.Background()
	root := &wire.User{}
	exec := func(id, script string) string {
		t.Helper()
		var out, errb strings.Builder
		code, err := r.n.Exec(ctx, id, ExecRequest{Args: []string{"/bin/sh", "-c", script}, User: root}, &out, &errb)
		if err != nil || code != 0 {
			t.Fatalf("exec %q in %s: %d, %v, stderr %q", script, id, code, err, errb.String())
		}
		return strings.TrimSpace(out.String())
	}

	// A claim of a template with no pool first, released: the node's first
	// nft and DNS work is then in neither measured claim.
	wu := claimReq("c-warmup", 1)
	wu.RootFS.Template = "noecho"
	r.mustClaim("warmup", wu)
	r.mustRelease("warmup", "r-warmup", 1)

	req := claimReq("c-warm", 1)
	req.Process.Env = []string{"CLAIM_ENV=warm-a"}
	t1 := time.Now()
	got := r.mustClaim("warm-a", req).Sandbox
	warmMS := time.Since(t1).Milliseconds()
	if got.WarmMember != m.Rec.ID || got.ContainerID != m.Rec.ContainerID {
		t.Fatalf("the claim did not take member %s: %+v", m.Rec.ID, got)
	}
	// The claim was answered once its command checked runnable; the
	// pre-forked process's exec may still be under way.
	for deadline := time.Now().Add(time.Minute); exec("warm-a", "pidof sleep || true") == ""; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claim's workload never became sleep")
		}
	}
	// The guest's processes: the agent (pid 1) and the workload, apart
	// from this exec's own shell and ps.
	ps := exec("warm-a", "ps -o pid,args")
	var agent, workload bool
	for _, l := range strings.Split(ps, "\n")[1:] {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "1" && strings.Contains(l, "ctl-agent"):
			agent = true
		case strings.Contains(l, "sleep 2147483647"):
			workload = true
		case strings.Contains(l, "/bin/sh -c ps") || strings.Contains(l, "ps -o pid,args"):
		default:
			t.Errorf("a process the claim did not start: %q", l)
		}
	}
	if !agent || !workload {
		t.Errorf("process list %q: want the agent as pid 1 and the workload", ps)
	}
	env := exec("warm-a", "tr '\\0' '\\n' < /proc/$(pidof sleep)/environ")
	for _, e := range strings.Split(env, "\n") {
		if e != "CLAIM_ENV=warm-a" && !strings.HasPrefix(e, "PATH=") {
			t.Errorf("the workload's environ holds %q, not the claim's (%q)", e, env)
		}
	}
	if !strings.Contains(env, "CLAIM_ENV=warm-a") {
		t.Errorf("the workload's environ %q lacks the claim's", env)
	}
	if got := exec("warm-a", "hostname"); got != "warm-a" {
		t.Errorf("hostname %q, want the claim's", got)
	}
	// A glob reads the dir alone (stat of the host socket is refused):
	// the socket and, once written, the agent's claim report; no nonce.
	if got := exec("warm-a", "echo /.ctl/*"); got != "/.ctl/agent.sock" && got != "/.ctl/agent.sock /.ctl/"+wire.ClaimReportName {
		t.Errorf("agent socket dir after the claim: %q, want the socket and the claim report alone (no nonce file)", got)
	}

	creq := claimReq("c-cold", 1)
	creq.Process.Env = []string{"CLAIM_ENV=cold-b"}
	t2 := time.Now()
	cold := r.mustClaim("cold-b", creq).Sandbox
	coldMS := time.Since(t2).Milliseconds()
	if cold.WarmMember != "" {
		t.Fatalf("the second claim took a member with the pool drained: %+v", cold)
	}
	if got := exec("cold-b", "echo ok"); got != "ok" {
		t.Errorf("exec in the cold claim: %q", got)
	}
	wt, ct := got.Timings, cold.Timings
	t.Logf("claim (node.Claim wall): warm %d ms, cold %d ms (%.3fx)", warmMS, coldMS, float64(warmMS)/float64(coldMS))
	t.Logf("warm timings: total %.0f ms = admit %.0f, network (policy) %.0f, lease resize %.0f, disk quota %.0f, agent claim (proof) %.0f", wt.TotalMS, wt.AdmitMS, wt.NetworkMS, wt.LeaseMS, wt.RootFSMS, wt.ProofMS)
	t.Logf("cold timings: total %.0f ms = admit %.0f, lease %.0f, rootfs %.0f, network %.0f, runsc %.0f, proof %.0f", ct.TotalMS, ct.AdmitMS, ct.LeaseMS, ct.RootFSMS, ct.NetworkMS, ct.RunscMS, ct.ProofMS)
	t.Logf("warm steps: %+v", wt.Steps)
	t.Logf("cold steps: %+v", ct.Steps)
	st, _ := r.n.WarmPools()
	if s := st["busybox"]; s.Hits != 1 || s.Misses != 1 {
		t.Errorf("pool stats %+v, want 1 hit and 1 miss", s)
	}

	r.mustRelease("warm-a", "r-warm", 1)
	r.mustRelease("cold-b", "r-cold", 1)
	r.checkProof("r-warmup")
	r.checkProof("r-warm")
	r.checkProof("r-cold")
	r.checkClean("after both releases")
	checkUnjournaled(r, crashCase{})
}

// TestKernelWarmPoolDeadMember: a real member whose guest was killed
// (sandbox and gofer) is destroyed when a claim takes it, with a clean
// proof, and the claim is made cold and ready; nothing is left.
func TestKernelWarmPoolDeadMember(t *testing.T) {
	k := warmKernel(t)
	r := newRig(t, k)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	r.k.killGuest(t, m.Rec.ContainerID)
	t1 := time.Now()
	got := r.mustClaim("sb", claimReq("c1", 1)).Sandbox
	t.Logf("claim of a dead member, made cold: %d ms", time.Since(t1).Milliseconds())
	if got.State != journal.StateReady || got.WarmMember != "" || got.ContainerID != containerID("sb", 1) {
		t.Fatalf("claim of a dead member: %+v, want a ready cold claim", got)
	}
	p := r.checkProof("warm-destroy-" + m.Rec.ID)
	if p.LeaseID != m.Rec.LeaseID {
		t.Errorf("proof of the dead member names lease %s, want %s", p.LeaseID, m.Rec.LeaseID)
	}
	var out strings.Builder
	if code, err := r.n.Exec(context.Background(), "sb", ExecRequest{Args: []string{"/bin/sh", "-c", "echo ok"}}, &out, &out); err != nil || code != 0 || strings.TrimSpace(out.String()) != "ok" {
		t.Errorf("exec in the cold claim: %d %v %q", code, err, out.String())
	}
	if st, _ := r.n.WarmPools(); st["busybox"].Hits != 0 || st["busybox"].Misses != 1 {
		t.Errorf("pool stats %+v, want 0 hits and 1 miss", st["busybox"])
	}
	r.mustRelease("sb", "r1", 1)
	r.checkProof("r1")
	r.checkClean("after the fallback's release")
	checkUnjournaled(r, crashCase{})
}

// warmKernel is the real kernel with a pool of one busybox member: it
// boots at the claims' CPU, then idles at its own small share; no refill
// within a test (a second claim must miss).
func warmKernel(t *testing.T) *testKernel {
	ktest.Require(t)
	k := realKernel(t)
	k.noReuse = true
	k.bootCPU = 2000
	k.warmRes = journal.Resources{CPUMillis: 250, MemoryBytes: 256 << 20, PIDs: 512}
	k.warm = warm.Settings{Sizes: map[string]int{"busybox": 1}, RefillEvery: time.Hour}
	return k
}
