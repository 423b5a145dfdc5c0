package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/proof"
)

// holdProcess starts a host process that keeps one of a generation's
// kernel objects alive after ctld removed its name, and waits until it
// does (ready); the test's cleanup kills it.
func holdProcess(t *testing.T, ready func(pid int) bool, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !ready(cmd.Process.Pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s %v not holding within 10s", name, args)
		}
	}
	return cmd
}

func stopProcess(cmd *exec.Cmd) { _ = cmd.Process.Kill(); _ = cmd.Wait() }

// holdNetns keeps the generation's netns alive with a process in it.
func holdNetns(t *testing.T, cid string) *exec.Cmd {
	t.Helper()
	p := "/run/netns/ctld-" + cid
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return holdProcess(t, func(pid int) bool {
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		return ns != "" && ns != self
	}, "nsenter", "--net="+p, "sleep", "1000")
}

// holdRoot keeps the generation's overlay alive with a process whose cwd
// is inside the root: ctld's unmount is busy and falls back to a lazy
// detach, which leaves the superblock alive.
func holdRoot(t *testing.T, root string) *exec.Cmd {
	t.Helper()
	return holdProcess(t, func(pid int) bool {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		return cwd == root
	}, "sh", "-c", "cd "+root+" && exec sleep 1000")
}

func failedNames(cs []api.ProofCheck) []string {
	var out []string
	for _, c := range cs {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	slices.Sort(out)
	return out
}

// ctlManager runs the real ctl-manager binary against the env's node.
func (e *env) ctlManager(args ...string) string {
	e.t.Helper()
	bin := filepath.Join(filepath.Dir(e.bin), "ctl-manager")
	full := append([]string{"--socket", filepath.Join(e.runDir, "ctld.sock"), "--db", filepath.Join(filepath.Dir(e.stateDir), "manager.db")}, args...)
	out, err := exec.Command(bin, full...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("ctl-manager %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// logsContain reports whether any instance's log has a line with all of subs.
func (e *env) logsContain(subs ...string) bool {
	logs, _ := filepath.Glob(filepath.Join(filepath.Dir(e.stateDir), "ctld-*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(b), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(line, s)
			}
			if all {
				return true
			}
		}
	}
	return false
}

// TestWithheldRetriedOnTimer: a release whose overlay and netns are kept
// alive by host processes is withheld with its failed checks (GET
// /v1/node, `ctl-manager node withheld`); timer retries keep it withheld
// while the holders live, and once they exit a retry produces a clean
// signed proof that returns the capacity.
// heldChecks are the proof checks a held root and netns make fail.
var heldChecks = []string{"disk_quota_cleared", "mounts_gone", "netns_gone"}

func TestWithheldRetriedOnTimer(t *testing.T) {
	e := newEnv(t)
	ktest.RequireBinary(t, "nsenter")
	e.args = []string{"--withheld-retry", "2s", "--withheld-retry-max", "4s"}
	e.start("a")
	n0 := e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 8*time.Minute)
	res, err := c.Claim(cx, "held", claimReq("claim-held", 1))
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	cid := res.Sandbox.ContainerID
	root := filepath.Join(e.stateDir, "scratch", cid, "root")
	rootHolder := holdRoot(t, root)
	nsHolder := holdNetns(t, cid)

	rel, err := c.Release(cx, "held", api.ReleaseRequest{OperationID: "release-held", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	// The held overlay also keeps the generation's files charged to its
	// disk project, so the quota cannot be cleared either.
	if rel.Proof.Clean || !slices.Equal(failedNames(rel.Proof.Checks), heldChecks) {
		t.Fatalf("release proof: clean %v, failed %v; want %v failed:\n%+v", rel.Proof.Clean, failedNames(rel.Proof.Checks), heldChecks, rel.Proof.Checks)
	}
	for _, ch := range rel.Proof.Checks {
		pid := map[string]int{"mounts_gone": rootHolder.Process.Pid, "netns_gone": nsHolder.Process.Pid}[ch.Name]
		if pid != 0 && !strings.Contains(ch.Detail, fmt.Sprintf("pid %d", pid)) {
			t.Errorf("%s detail %q does not name the holder pid %d", ch.Name, ch.Detail, pid)
		}
	}

	// Listed as withheld with its failed checks, and retried by the timer
	// without passing while the holders live. An attempt is a whole
	// teardown (three runsc calls) and the /proc scans: seconds under
	// emulation, more on a loaded machine.
	var wl api.WithheldLease
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := c.Node(cx)
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Withheld) != 1 || n.Capacity.Withheld.CPUMillis != 500 || n.Capacity.Leased != (api.Capacity{}) {
			t.Fatalf("node: withheld %+v, capacity withheld %+v leased %+v; want one 500m withheld generation", n.Withheld, n.Capacity.Withheld, n.Capacity.Leased)
		}
		wl = n.Withheld[0]
		if wl.RetryAttempts >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no two timer retries within 90s: %+v", wl)
		}
	}
	if wl.SandboxID != "held" || wl.Generation != 1 || wl.ProofOperationID != "retry-"+cid || wl.NextAttempt.IsZero() ||
		!slices.Equal(failedNames(wl.FailedChecks), heldChecks) {
		t.Fatalf("withheld entry %+v; want held/1, retried, proof retry-%s, %v failed", wl, cid, heldChecks)
	}
	out := e.ctlManager("node", "withheld")
	for _, want := range []string{"held generation 1", "latest proof: retry-" + cid, "FAILED mounts_gone", "FAILED netns_gone", fmt.Sprintf("pid %d", rootHolder.Process.Pid), fmt.Sprintf("pid %d", nsHolder.Process.Pid)} {
		if !strings.Contains(out, want) {
			t.Errorf("ctl-manager node withheld lacks %q:\n%s", want, out)
		}
	}
	var ws []api.WithheldLease
	if err := json.Unmarshal([]byte(e.ctlManager("--json", "node", "withheld")), &ws); err != nil || len(ws) != 1 || len(ws[0].FailedChecks) != len(heldChecks) {
		t.Errorf("ctl-manager --json node withheld = %+v, %v", ws, err)
	}
	t.Logf("ctl-manager node withheld:\n%s", out)
	if !e.logsContain("retrying teardown of withheld generation", "trigger=timer") || !e.logsContain("withheld generation still unproven") {
		t.Errorf("retry attempts not logged")
	}

	// The obstacles go; a timer retry proves the generation gone.
	stopProcess(rootHolder)
	stopProcess(nsHolder)
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := c.Node(cx)
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Withheld) == 0 && n.Capacity.Withheld == (api.Capacity{}) && n.Capacity.Leased == (api.Capacity{}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still withheld 120s after the holders exited: %+v", n.Withheld)
		}
	}
	p, err := c.Proof(cx, "retry-"+cid)
	if err != nil || !p.Clean {
		t.Fatalf("retry proof: %+v, %v; want clean", p, err)
	}
	if err := proof.Verify(p.Record(), n0.NodeKey); err != nil {
		t.Fatalf("verify retry proof: %v", err)
	}
	sb, err := c.Get(cx, "held")
	if err != nil || sb.State != api.StateReleased || strings.Contains(sb.Reason, "unproven") {
		t.Fatalf("sandbox after the clean retry: %+v, %v", sb, err)
	}
	if !e.logsContain("withheld generation proven clean") {
		t.Errorf("clean retry not logged")
	}
	// Its identity can be claimed again.
	if _, err := c.Claim(cx, "held", claimReq("claim-held-2", 2)); err != nil {
		t.Fatalf("claim after the clean retry: %v", err)
	}
	if _, err := c.Release(cx, "held", api.ReleaseRequest{OperationID: "release-held-2", Generation: 2}); err != nil {
		t.Fatalf("release generation 2: %v", err)
	}
}

// TestWithheldRetriedOnTakeover: a generation withheld under one primary
// (its netns held by a process) is retried by the next primary's
// reconcile, whatever its backoff, and proven clean once the holder is
// gone.
func TestWithheldRetriedOnTakeover(t *testing.T) {
	e := newEnv(t)
	ktest.RequireBinary(t, "nsenter")
	e.args = []string{"--withheld-retry", "1h"} // the timer cannot be what clears it
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 4*time.Minute)
	res, err := c.Claim(cx, "held", claimReq("claim-held", 1))
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	cid := res.Sandbox.ContainerID
	holder := holdNetns(t, cid)
	rel, err := c.Release(cx, "held", api.ReleaseRequest{OperationID: "release-held", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if rel.Proof.Clean || !slices.Equal(failedNames(rel.Proof.Checks), []string{"netns_gone"}) {
		t.Fatalf("release proof: clean %v, failed %v; want netns_gone failed", rel.Proof.Clean, failedNames(rel.Proof.Checks))
	}
	if n, _ := c.Node(cx); len(n.Withheld) != 1 || n.Withheld[0].RetryAttempts != 0 {
		t.Fatalf("withheld after release: %+v", n.Withheld)
	}
	e.kill9("a")
	stopProcess(holder)
	e.start("b")
	n := e.waitPrimary("b", 60*time.Second)
	if len(n.Withheld) != 0 || n.Capacity.Withheld != (api.Capacity{}) {
		t.Fatalf("after takeover: withheld %+v (%+v); want none", n.Withheld, n.Capacity.Withheld)
	}
	p, err := c.Proof(cx, "retry-"+cid)
	if err != nil || !p.Clean || p.Epoch != n.Epoch {
		t.Fatalf("retry proof: %+v, %v; want clean, by epoch %d", p, err, n.Epoch)
	}
	if err := proof.Verify(p.Record(), n.NodeKey); err != nil {
		t.Fatal(err)
	}
	if !e.logsContain("retrying teardown of withheld generation", "trigger=takeover") {
		t.Errorf("takeover retry not logged")
	}
}
