package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"

	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/proof"
)

// TestClaimExecFilesRelease is one sandbox end to end on one instance,
// then a leak check.
func TestClaimExecFilesRelease(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	n0 := e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 3*time.Minute)
	fdsBefore := e.fds("a")

	res, err := c.Claim(cx, "sb1", claimReq("claim-sb1-1", 1))
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if res.Sandbox.State != api.StateReady || res.Sandbox.Generation != 1 {
		t.Fatalf("claim answered %+v, want ready generation 1", res.Sandbox)
	}
	tm := res.Sandbox.Timings
	t.Logf("claim timings ms: lease %.1f rootfs %.1f network %.1f runsc %.1f proof %.1f total %.1f", tm.LeaseMS, tm.RootFSMS, tm.NetworkMS, tm.RunscMS, tm.ProofMS, tm.TotalMS)

	// The same operation id returns the first result, without a new claim.
	again, err := c.Claim(cx, "sb1", claimReq("claim-sb1-1", 1))
	if err != nil || again.Sandbox.ContainerID != res.Sandbox.ContainerID {
		t.Fatalf("repeated claim: %+v, %v; want the first result", again.Sandbox, err)
	}
	// A second claim of a live sandbox is a conflict.
	if _, err := c.Claim(cx, "sb1", claimReq("claim-sb1-2", 2)); codeOf(err) != errdefs.CodeConflict {
		t.Fatalf("second claim of a live sandbox: %v, want conflict", err)
	}

	n1, err := c.Node(cx)
	if err != nil {
		t.Fatal(err)
	}
	if n1.Capacity.Leased.CPUMillis != 500 || n1.Capacity.Leased.MemoryBytes != 256<<20 {
		t.Fatalf("leased capacity %+v, want 500m and 256MiB", n1.Capacity.Leased)
	}

	var out, errb bytes.Buffer
	code, err := c.ExecStream(cx, "sb1", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo hello from $(hostname); echo oops >&2; exit 7"}}, &out, &errb)
	if err != nil || code != 7 || out.String() != "hello from sb1\n" || errb.String() != "oops\n" {
		t.Fatalf("exec stream: code %d err %v stdout %q stderr %q", code, err, out.String(), errb.String())
	}
	// The guest has its veth (a default route via its gateway, the
	// node's end) but deny_all: a dial out fails.
	r, err := c.Exec(cx, "sb1", api.ExecRequest{Args: []string{"/bin/cat", "/proc/net/route"}})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("read guest routes: %+v, %v", r, err)
	}
	if !regexp.MustCompile(`(?m)^eth0\s+00000000\s+[0-9A-F]{8}\s`).Match(r.Stdout) {
		t.Fatalf("guest has no default route via eth0:\n%s", r.Stdout)
	}
	r, err = c.Exec(cx, "sb1", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo x | nc -w 2 10.0.2.2 80"}})
	if err != nil || r.ExitCode == 0 {
		t.Fatalf("guest dial out: exit %d (%v); want a failure: deny_all", r.ExitCode, err)
	}

	if err := c.WriteFile(cx, "sb1", "/root/note.txt", []byte("written by the API")); err != nil {
		t.Fatalf("write file: %v", err)
	}
	got, err := c.ReadFile(cx, "sb1", "/root/note.txt")
	if err != nil || string(got) != "written by the API" {
		t.Fatalf("read file: %q, %v", got, err)
	}
	r, err = c.Exec(cx, "sb1", api.ExecRequest{Args: []string{"/bin/cat", "/root/note.txt"}})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "written by the API" {
		t.Fatalf("guest sees %q (exit %d, stderr %q, %v), want the file written through the API", r.Stdout, r.ExitCode, r.Stderr, err)
	}
	if _, err := c.ReadFile(cx, "sb1", "/../../../etc/shadow"); err == nil {
		// Resolved inside the root: the guest's /etc/shadow does not exist.
		t.Fatalf("read of /../../../etc/shadow succeeded; it must resolve inside the root")
	}

	rel, err := c.Release(cx, "sb1", api.ReleaseRequest{OperationID: "release-sb1-1", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean {
		t.Fatalf("cleanup proof not clean: %+v", rel.Proof.Checks)
	}
	// Verified against the key the node announced, not the one the proof carries.
	if err := proof.Verify(rel.Proof.Record(), n0.NodeKey); err != nil {
		t.Fatalf("verify proof against GET /v1/node's key: %v", err)
	}
	if rel.Proof.NodeID != n0.NodeID || rel.Proof.Epoch != n0.Epoch || rel.Proof.Generation != 1 {
		t.Fatalf("proof identity %s/%d/%d, want node %s epoch %d generation 1", rel.Proof.NodeID, rel.Proof.Epoch, rel.Proof.Generation, n0.NodeID, n0.Epoch)
	}
	p, err := c.Proof(cx, "release-sb1-1")
	if err != nil || string(p.Signature) != string(rel.Proof.Signature) {
		t.Fatalf("GET proof: %v", err)
	}
	n2, _ := c.Node(cx)
	if n2.Capacity.Leased != (api.Capacity{}) {
		t.Fatalf("capacity not returned after a clean proof: leased %+v", n2.Capacity.Leased)
	}
	// Repeating the release returns the same proof.
	rel2, err := c.Release(cx, "sb1", api.ReleaseRequest{OperationID: "release-sb1-1", Generation: 1})
	if err != nil || string(rel2.Proof.Signature) != string(rel.Proof.Signature) {
		t.Fatalf("repeated release: %v", err)
	}
	// ctld itself leaks nothing per sandbox: its open fds are back to the
	// count before the claim (allowing a moment for closed connections).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		fds := e.fds("a")
		if len(fds) <= len(fdsBefore) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ctld fds: %d before the claim, %d after the release:\nbefore %v\nafter  %v", len(fdsBefore), len(fds), fdsBefore, fds)
		}
	}
	// A new generation of the same identity.
	if _, err := c.Claim(cx, "sb1", claimReq("claim-sb1-3", 2)); err != nil {
		t.Fatalf("claim generation 2: %v", err)
	}
	if _, err := c.Release(cx, "sb1", api.ReleaseRequest{OperationID: "release-sb1-3", Generation: 2}); err != nil {
		t.Fatalf("release generation 2: %v", err)
	}
}

// TestCapacityExhausted: a claim beyond allocatable is refused and leaves
// nothing.
func TestCapacityExhausted(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, time.Minute)
	n, _ := c.Node(cx)
	req := claimReq("big", 1)
	req.Resources.CPUMillis = n.Capacity.Allocatable.CPUMillis + 1
	if _, err := c.Claim(cx, "big", req); codeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("claim beyond allocatable: %v, want capacity_exhausted", err)
	}
	if l, _ := c.List(cx); len(l.Sandboxes) != 0 {
		t.Fatalf("refused claim left records: %+v", l.Sandboxes)
	}
}

// TestFailoverWithLiveGuest: kill -9 of the primary while a guest runs; the
// standby takes over, re-adopts the guest, and exec and release still work.
// The killed instance rejoins as standby.
func TestFailoverWithLiveGuest(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	na := e.waitPrimary("a", 60*time.Second)
	e.start("b")
	c := e.client()
	cx := ctx(t, 3*time.Minute)
	if _, err := c.Claim(cx, "live", claimReq("claim-live", 1)); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if _, err := c.Exec(cx, "live", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo before > /tmp/mark"}}); err != nil {
		t.Fatalf("exec before failover: %v", err)
	}
	start := time.Now()
	e.kill9("a")
	nb := e.waitPrimary("b", 60*time.Second)
	t.Logf("failover: kill -9 to standby serving in %v", time.Since(start))
	if nb.Epoch <= na.Epoch {
		t.Fatalf("epoch after failover %d, want > %d", nb.Epoch, na.Epoch)
	}
	sb, err := c.Get(cx, "live")
	if err != nil || sb.State != api.StateReady {
		t.Fatalf("after failover sandbox is %+v (%v), want ready", sb, err)
	}
	r, err := c.Exec(cx, "live", api.ExecRequest{Args: []string{"/bin/cat", "/tmp/mark"}})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "before" {
		t.Fatalf("exec after failover: %q, %v (the guest must have kept running)", r.Stdout, err)
	}
	e.start("a") // rejoins as standby: no failback
	time.Sleep(500 * time.Millisecond)
	if n, _ := c.Node(cx); n.Slot != "b" {
		t.Fatalf("restarted a took over (slot %s): no failback expected", n.Slot)
	}
	rel, err := c.Release(cx, "live", api.ReleaseRequest{OperationID: "release-live", Generation: 1})
	if err != nil || !rel.Proof.Clean || rel.Proof.Epoch != nb.Epoch {
		t.Fatalf("release after failover: %+v, %v", rel.Proof, err)
	}
	if err := proof.Verify(rel.Proof.Record(), nil); err != nil {
		t.Fatal(err)
	}
}

// TestCrashBetweenIntendedAndDone kills the primary (SIGKILL at a crash
// point) in the middle of each effect of a claim. The standby must take
// over, roll the claim back with a clean proof, and leave nothing behind;
// a retry of the operation gets the stored failure, a new claim works.
//
// Every crash point is covered in-process, by TestCrashPoints (fake kernel)
// and TestKernelCrashPoints (real kernel, internal/node); this test proves
// the real binaries' failover on one point per phase: before the first
// kernel effect, after a mount, after the generation's nft objects, and
// around the guest (about 35 s each in CI; the disk quota's points are
// TestKernelCrashPoints' alone).
func TestCrashBetweenIntendedAndDone(t *testing.T) {
	points := []string{"cgroup:intended", "mount:made", "nft:made", "runsc:made", "runsc:done"}
	for _, point := range points {
		t.Run(strings.ReplaceAll(point, ":", "-"), func(t *testing.T) {
			e := newEnv(t)
			e.start("a", "CTLD_TEST_CRASH_AT="+point)
			e.waitPrimary("a", 60*time.Second)
			e.start("b")
			c := e.client()
			cx := ctx(t, 3*time.Minute)
			if _, err := c.Claim(cx, "crash", claimReq("claim-crash", 1)); err == nil {
				t.Fatalf("claim succeeded although the primary was to die at %s", point)
			}
			e.waitExit("a", 30*time.Second)
			e.waitPrimary("b", 60*time.Second)
			sb, err := c.Get(cx, "crash")
			if err != nil {
				t.Fatalf("get after takeover: %v", err)
			}
			if sb.State != api.StateFailed {
				t.Fatalf("after takeover the half-done claim is %s, want failed (rolled back)", sb.State)
			}
			if _, err := c.Claim(cx, "crash", claimReq("claim-crash", 1)); codeOf(err) != errdefs.CodeUnavailable {
				t.Fatalf("retry of the interrupted operation: %v, want its stored unavailable error", err)
			}
			n, _ := c.Node(cx)
			if n.Capacity.Leased != (api.Capacity{}) || n.Capacity.Withheld != (api.Capacity{}) {
				t.Fatalf("capacity after rollback: leased %+v withheld %+v", n.Capacity.Leased, n.Capacity.Withheld)
			}
			if e.logsContain("removing an object the journal has no record of") {
				t.Fatalf("the rollback removed objects the journal did not name")
			}
			if _, err := c.Claim(cx, "crash", claimReq("claim-crash-2", 2)); err != nil {
				t.Fatalf("new claim after rollback: %v", err)
			}
			if _, err := c.Release(cx, "crash", api.ReleaseRequest{OperationID: "release-crash-2", Generation: 2}); err != nil {
				t.Fatalf("release: %v", err)
			}
		})
	}
}

// TestCrashDuringReleaseCompletedByStandby kills the primary in the middle
// of a release's teardown (after a removal, before the next; before the
// signed proof is journaled). The standby must complete the release from
// the journal's effect records: released, a clean verified proof under the
// release's operation id, capacity back, nothing left (CheckLeaks), and no
// object removed that the journal did not name.
func TestCrashDuringReleaseCompletedByStandby(t *testing.T) {
	for _, point := range []string{"runsc:removed", "mount:removing", "proof:signed"} {
		t.Run(strings.ReplaceAll(point, ":", "-"), func(t *testing.T) {
			e := newEnv(t)
			e.start("a", "CTLD_TEST_CRASH_AT="+point)
			e.waitPrimary("a", 60*time.Second)
			e.start("b")
			c := e.client()
			cx := ctx(t, 3*time.Minute)
			if _, err := c.Claim(cx, "relcrash", claimReq("claim-relcrash", 1)); err != nil {
				t.Fatalf("claim: %v", err)
			}
			rel := api.ReleaseRequest{OperationID: "release-relcrash", Generation: 1}
			if _, err := c.Release(cx, "relcrash", rel); err == nil {
				t.Fatalf("release succeeded although the primary was to die at %s", point)
			}
			e.waitExit("a", 30*time.Second)
			e.waitPrimary("b", 60*time.Second)
			res, err := c.Release(cx, "relcrash", rel)
			if err != nil {
				t.Fatalf("retry of the release after takeover: %v", err)
			}
			if res.Sandbox.State != api.StateReleased || !res.Proof.Clean {
				t.Fatalf("after takeover: state %s, proof clean %v (%s)", res.Sandbox.State, res.Proof.Clean, res.Sandbox.Reason)
			}
			if err := proof.Verify(res.Proof.Record(), nil); err != nil {
				t.Fatal(err)
			}
			if res.Sandbox.ReleaseTimings == nil || len(res.Sandbox.ReleaseTimings.Steps) != len(res.Proof.Checks) {
				t.Fatalf("release timings %+v, want one step per proof check (%d)", res.Sandbox.ReleaseTimings, len(res.Proof.Checks))
			}
			if n, _ := c.Node(cx); n.Capacity.Leased != (api.Capacity{}) || n.Capacity.Withheld != (api.Capacity{}) {
				t.Fatalf("capacity after release: leased %+v withheld %+v", n.Capacity.Leased, n.Capacity.Withheld)
			}
			if e.logsContain("removing an object the journal has no record of") {
				t.Fatalf("the takeover removed objects the journal did not name")
			}
		})
	}
}

// TestMaxLifetimeReleases: a sandbox claimed with max_lifetime_sec is
// released by the node at its deadline, with a verified cleanup proof, also
// when a failover happened in between (the new primary re-arms the timer).
func TestMaxLifetimeReleases(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	e.start("b")
	c := e.client()
	cx := ctx(t, 3*time.Minute)
	req := claimReq("claim-short", 1)
	req.MaxLifetimeSec = 20
	res, err := c.Claim(cx, "short", req)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	e.kill9("a")
	e.waitPrimary("b", 60*time.Second)
	deadline := res.Sandbox.CreatedAt.Add(20 * time.Second)
	for {
		sb, err := c.Get(cx, "short")
		if err != nil {
			t.Fatal(err)
		}
		if sb.State == api.StateReleased {
			if time.Now().Before(deadline) {
				t.Fatalf("released before its deadline %v", deadline)
			}
			break
		}
		if time.Now().After(deadline.Add(90 * time.Second)) {
			t.Fatalf("still %s 90s after its max lifetime", sb.State)
		}
		time.Sleep(500 * time.Millisecond)
	}
	p, err := c.Proof(cx, "expire-"+res.Sandbox.ContainerID)
	if err != nil {
		t.Fatalf("proof of the expiry release: %v", err)
	}
	if err := proof.Verify(p.Record(), nil); err != nil || !p.Clean {
		t.Fatalf("expiry proof: clean %v, %v", p.Clean, err)
	}
}

// TestGuestGoneWhilePrimaryDownIsMarkedLost: the journal says a generation
// is ready, the kernel says its guest is gone (killed while no primary was
// up): the new primary marks it lost, cleans up with a proof, and returns
// its capacity. The kernel is the truth for "exists".
func TestGuestGoneWhilePrimaryDownIsMarkedLost(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 3*time.Minute)
	res, err := c.Claim(cx, "doomed", claimReq("claim-doomed", 1))
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	e.kill9("a")
	kill := filepath.Join(ktest.CgroupRoot, e.parent, res.Sandbox.LeaseID, "cgroup.kill")
	if err := os.WriteFile(kill, []byte("1"), 0o644); err != nil {
		t.Fatalf("kill the guest: %v", err)
	}
	e.start("b")
	e.waitPrimary("b", 60*time.Second)
	sb, err := c.Get(cx, "doomed")
	if err != nil || sb.State != api.StateReleased || !strings.Contains(sb.Reason, "lost: [guest processes] gone") {
		t.Fatalf("after takeover: %+v, %v; want released with reason lost (guest processes gone)", sb, err)
	}
	p, err := c.Proof(cx, "lost-"+res.Sandbox.ContainerID)
	if err != nil || !p.Clean {
		t.Fatalf("proof of the lost generation: %+v, %v", p, err)
	}
	if err := proof.Verify(p.Record(), nil); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Node(cx); n.Capacity.Leased != (api.Capacity{}) {
		t.Fatalf("capacity of the lost generation not returned: %+v", n.Capacity.Leased)
	}
}
