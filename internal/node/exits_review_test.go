package node

import (
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/journal"
)

// stays fails the test unless sandbox id stays in state want for d.
func stays(t *testing.T, r *rig, id string, want journal.State, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if s := r.sandbox(id); s.State != want {
			t.Fatalf("sandbox %s is %s (%s), want it to stay %s", id, s.State, s.Reason, want)
		}
	}
}

// TestExitReportWithoutEnd (hostile guest): a workload writes an exit
// report into its agent socket dir (its root can) and runs on. The
// report is no end: the generation stays ready (metered, not destroyed),
// under the watch and across a takeover; once its lease empties, the exit
// is journaled with the report's code.
func TestExitReportWithoutEnd(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.exitPoll = 10 * time.Millisecond
	r := newRig(t, tk)
	r.mustBoot()
	cid := r.mustClaim("liar", claimReq("c-liar", 1)).Sandbox.ContainerID
	if err := agent.WriteExitReport(r.n.guest.AgentSockDir(cid), 4); err != nil {
		t.Fatal(err)
	}
	stays(t, r, "liar", journal.StateReady, 300*time.Millisecond)
	r.end()
	r.n.Close()
	r.mustBoot()
	if s := r.sandbox("liar"); s.State != journal.StateReady {
		t.Fatalf("after a takeover: %s (%s), want ready", s.State, s.Reason)
	}
	stays(t, r, "liar", journal.StateReady, 100*time.Millisecond)
	k.KillGuest(cid)
	s := waitState(t, r, "liar", journal.StateExited, 2*time.Second)
	if s.Exit == nil || s.Exit.Kind != journal.ExitNormal || s.Exit.Code != 4 {
		t.Fatalf("exit %+v, want normal code 4 (the report, read once the lease emptied)", s.Exit)
	}
	r.mustRelease("liar", "r-liar", 1)
	r.checkProof("r-liar")
	r.checkClean("after the release")
}

// TestExitedKeepsExpiryOnTakeover: an exited on_exit keep generation
// still ends at its max lifetime after a takeover, whether it exited
// before (journaled exited) or while no primary watched (found by the
// reconcile): the new primary re-arms its expiry.
func TestExitedKeepsExpiryOnTakeover(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.exitPoll = 10 * time.Millisecond
	r := newRig(t, tk)
	r.mustBoot()
	req := claimReq("c-before", 1)
	req.MaxLifetimeSec = 2
	before := r.mustClaim("before", req).Sandbox.ContainerID
	req = claimReq("c-unseen", 1)
	req.MaxLifetimeSec = 2
	unseen := r.mustClaim("unseen", req).Sandbox.ContainerID
	if err := k.ExitGuest(before, 0); err != nil {
		t.Fatal(err)
	}
	waitState(t, r, "before", journal.StateExited, 2*time.Second)
	r.end()
	r.n.Close()
	if err := k.ExitGuest(unseen, 1); err != nil {
		t.Fatal(err)
	}
	r.mustBoot()
	if s := r.sandbox("unseen"); s.State != journal.StateExited {
		t.Fatalf("unseen after the takeover: %s (%s), want exited", s.State, s.Reason)
	}
	for id, cid := range map[string]string{"before": before, "unseen": unseen} {
		s := waitState(t, r, id, journal.StateReleased, 5*time.Second)
		if s.ProofOp != expiryOp(cid) || s.Exit == nil {
			t.Fatalf("%s: released under %q exit %+v, want %s with the exit kept", id, s.ProofOp, s.Exit, expiryOp(cid))
		}
		r.checkProof(expiryOp(cid))
	}
	r.checkClean("after the expiries")
}

// TestExitDuringSeal: a guest that ends while a pause seals its
// generation (the pause holds the sandbox's lock, its seal journaled
// sealing) is not journaled exited under the seal, which would then
// overwrite it; once the pause let go (here: abandoned, the generation
// kept), the exit is journaled.
func TestExitDuringSeal(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.exitPoll = 10 * time.Millisecond
	r := newRig(t, tk)
	r.mustBoot()
	cid := r.mustClaim("seal", claimReq("c-seal", 1)).Sandbox.ContainerID
	setSeal := func(st journal.SealState) {
		t.Helper()
		if err := r.n.d.Journal.Update(func(tx *journal.Tx) error {
			s, _, err := tx.Sandbox("seal")
			if err != nil {
				return err
			}
			s.Seal = &journal.SealRecord{State: st, OperationID: "p-seal"}
			return tx.PutSandbox(s)
		}); err != nil {
			t.Fatal(err)
		}
	}
	unlock := r.n.lockSandbox("seal")
	setSeal(journal.SealSealing)
	if err := k.ExitGuest(cid, 6); err != nil {
		t.Fatal(err)
	}
	stays(t, r, "seal", journal.StateReady, 300*time.Millisecond)
	setSeal(journal.SealAbandoned)
	unlock()
	s := waitState(t, r, "seal", journal.StateExited, 2*time.Second)
	if s.Exit == nil || s.Exit.Code != 6 {
		t.Fatalf("exit %+v, want code 6", s.Exit)
	}
	r.mustRelease("seal", "r-seal", 1)
	r.checkProof("r-seal")
	r.checkClean("after the release")
}
