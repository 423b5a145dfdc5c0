package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
)

// waitGo is a workload that waits for /tmp/go (an exec makes it), then
// sleeps for the given seconds and exits with code.
func waitGo(sleep, code string) []string {
	return []string{"/bin/sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; sleep " + sleep + "; exit " + code}
}

// goNow makes sandbox id's waitGo workload go on, and returns when the
// exec returned.
func goNow(t *testing.T, r *rig, id string) time.Time {
	t.Helper()
	var out strings.Builder
	if code, err := r.n.Exec(context.Background(), id, ExecRequest{Args: []string{"/bin/touch", "/tmp/go"}}, &out, &out); err != nil || code != 0 {
		t.Fatalf("exec touch in %s: %d %v %s", id, code, err, out.String())
	}
	return time.Now()
}

// TestKernelGuestExit: real runsc guests end under a watching primary and
// the exit is journaled at once and told apart: a workload's `exit 7`
// (exited, code 7; its on_exit release then proves the cleanup and gives
// the capacity back), a workload that outgrows memory.max (oom), a guest
// killed from the host (crash); and a workload that exits while no
// primary runs is journaled, with its code, by the next primary.
func TestKernelGuestExit(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	k.exitPoll = time.Second // the fallback; inotify wakes the watch
	// Four small guests at once on the VM's two CPUs.
	k.resources = &journal.Resources{CPUMillis: 250, MemoryBytes: 256 << 20, PIDs: 256, DiskBytes: 64 << 20}
	r := newRig(t, k)
	r.mustBoot()

	// exit 7 with on_exit release.
	req := claimReq("c-ex7", 1)
	req.OnExit = journal.OnExitRelease
	req.Process.Args = waitGo("0", "7")
	cid := r.mustClaim("ex7", req).Sandbox.ContainerID
	before := leased(t, r)
	t0 := goNow(t, r, "ex7")
	s, took := waitExited(t, r, "ex7", 30*time.Second)
	t.Logf("ex7: %s %v after the exec that let it exit returned (exit journaled at +%v)", s.State, took, s.Exit.At.Sub(t0))
	if s.Exit == nil || s.Exit.Kind != journal.ExitNormal || s.Exit.Code != 7 {
		t.Fatalf("ex7: %s exit %+v (%s), want exit code 7", s.State, s.Exit, s.Reason)
	}
	s = waitState(t, r, "ex7", journal.StateReleased, time.Minute)
	t.Logf("ex7: released on exit %v after the exec (exit to release %v)", time.Since(t0), time.Since(s.Exit.At))
	if s.Exit.Code != 7 || s.ProofOp != exitOp(cid) {
		t.Fatalf("ex7 released: exit %+v proof op %q", s.Exit, s.ProofOp)
	}
	r.checkProof(exitOp(cid))
	if after := leased(t, r); after >= before {
		t.Errorf("ex7: %d millicores leased after the release on exit, %d before", after, before)
	}

	// OOM: the workload outgrows the lease's memory.max.
	res := *k.resources
	small := res
	small.MemoryBytes = 160 << 20
	k.resources = &small
	req = claimReq("c-oom", 1)
	// dd's 300 MiB buffer, filled by its read, outgrows memory.max.
	req.Process.Args = []string{"/bin/sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; dd if=/dev/zero of=/dev/null bs=314572800 count=1; sleep 100"}
	r.mustClaim("oom", req)
	k.resources = &res
	goNow(t, r, "oom")
	s, took = waitExited(t, r, "oom", 2*time.Minute)
	t.Logf("oom: %s (%s) %v after the exec", s.State, s.Reason, took)
	if s.State != journal.StateExited || s.Exit == nil || s.Exit.Kind != journal.ExitOOM || s.Exit.OOMKills == 0 {
		t.Fatalf("oom: %s exit %+v (%s), want exited oom", s.State, s.Exit, s.Reason)
	}

	// Crash: the guest's processes killed from the host.
	cid = r.mustClaim("crash", claimReq("c-crash", 1)).Sandbox.ContainerID
	start := time.Now()
	k.killGuest(t, cid)
	s, took = waitExited(t, r, "crash", 30*time.Second)
	t.Logf("crash: %s (%s) %v after cgroup.kill was written (%v after it emptied the lease)", s.State, s.Reason, time.Since(start), took)
	if s.State != journal.StateExited || s.Exit == nil || s.Exit.Kind != journal.ExitCrash {
		t.Fatalf("crash: %s exit %+v (%s), want exited crash", s.State, s.Exit, s.Reason)
	}

	// An exit while no primary runs: the workload exits 2 s after the
	// exec, the term ends at once.
	req = claimReq("c-nop", 1)
	req.Process.Args = waitGo("2", "5")
	r.mustClaim("nop", req)
	goNow(t, r, "nop")
	r.end()
	r.n.Close()
	nop := r.sandbox("nop")
	for i := 0; ; i++ {
		if pop, err := k.leases.Populated(context.Background(), nop.LeaseID); err == nil && !pop {
			break
		}
		if i == 600 {
			t.Fatal("nop: the guest never exited")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := r.sandbox("nop"); s.State != journal.StateReady {
		t.Fatalf("nop: %s with no primary watching", s.State)
	}
	r.mustBoot()
	if s := r.sandbox("nop"); s.State != journal.StateExited || s.Exit == nil || s.Exit.Code != 5 || s.Exit.SeenBy != r.epoch {
		t.Fatalf("nop after takeover: %s exit %+v (%s), want exited code 5 seen by epoch %d", s.State, s.Exit, s.Reason, r.epoch)
	}
	for _, id := range []string{"oom", "crash", "nop"} {
		r.mustRelease(id, "r-"+id, 1)
		r.checkProof("r-" + id)
	}
	r.checkClean("after the releases")
	checkUnjournaled(r, crashCase{})
}
