package node

import (
	"context"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// waitExited polls sandbox id until its generation left ready, and
// returns the record and how long that took.
func waitExited(t *testing.T, r *rig, id string, bound time.Duration) (journal.Sandbox, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		s := r.sandbox(id)
		if s.State != journal.StateReady {
			return s, time.Since(start)
		}
		if time.Since(start) > bound {
			t.Fatalf("sandbox %s still ready %v after its guest ended", id, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitState polls sandbox id until it is in state want.
func waitState(t *testing.T, r *rig, id string, want journal.State, bound time.Duration) journal.Sandbox {
	t.Helper()
	start := time.Now()
	for {
		s := r.sandbox(id)
		if s.State == want {
			return s
		}
		if time.Since(start) > bound {
			t.Fatalf("sandbox %s is %s (%s) after %v, want %s", id, s.State, s.Reason, bound, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func leased(t *testing.T, r *rig) int64 {
	t.Helper()
	info, err := r.n.Node(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.Capacity.Leased.CPUMillis
}

// TestExitJournaledAtOnce: the primary sees a ready generation's guest
// end while it runs and journals how: a normal exit with its code (the
// agent's report), an OOM kill (memory.events, no report) and a crash
// (neither) are told apart. on_exit keep (the default) keeps the
// generation and its capacity until a release, whose proof is clean and
// which keeps the exit in the record.
func TestExitJournaledAtOnce(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.exitPoll = 10 * time.Millisecond
	r := newRig(t, tk)
	r.mustBoot()
	cases := []struct {
		id   string
		end  func(cid string)
		kind journal.ExitKind
		code int
	}{
		{"ex7", func(cid string) {
			if err := k.ExitGuest(cid, 7); err != nil {
				t.Fatal(err)
			}
		}, journal.ExitNormal, 7},
		{"oom", k.OOMKillGuest, journal.ExitOOM, -1},
		{"crash", k.KillGuest, journal.ExitCrash, -1},
	}
	for i, c := range cases {
		resp := r.mustClaim(c.id, claimReq("c-"+c.id, 1))
		c.end(resp.Sandbox.ContainerID)
		s, took := waitExited(t, r, c.id, 2*time.Second)
		if s.State != journal.StateExited || s.Exit == nil || s.Exit.Kind != c.kind || s.Exit.Code != c.code || s.Exit.SeenBy != r.epoch || s.Exit.At.IsZero() {
			t.Fatalf("%s: %s exit %+v (%s), want exited %s code %d seen by epoch %d", c.id, s.State, s.Exit, s.Reason, c.kind, c.code, r.epoch)
		}
		t.Logf("%s: exited (%s) journaled %v after the guest ended", c.id, s.Reason, took)
		if got := leased(t, r); got != int64(i+1)*200 {
			t.Errorf("%s: %d millicores leased, want %d: on_exit keep holds the capacity", c.id, got, (i+1)*200)
		}
	}
	for _, c := range cases {
		r.mustRelease(c.id, "r-"+c.id, 1)
		r.checkProof("r-" + c.id)
		if s := r.sandbox(c.id); s.State != journal.StateReleased || s.Exit == nil || s.Exit.Kind != c.kind {
			t.Errorf("%s after release: %s exit %+v, want released with the exit kept", c.id, s.State, s.Exit)
		}
	}
	r.checkClean("after the releases")
}

// TestOnExitRelease: a claim with on_exit release is released the moment
// its guest ends: a clean signed proof under exit-<container>, capacity
// back, the exit code kept in the record.
func TestOnExitRelease(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.exitPoll = 10 * time.Millisecond
	r := newRig(t, tk)
	r.mustBoot()
	req := claimReq("c1", 1)
	req.OnExit = journal.OnExitRelease
	resp := r.mustClaim(sb, req)
	cid := resp.Sandbox.ContainerID
	if err := k.ExitGuest(cid, 3); err != nil {
		t.Fatal(err)
	}
	s := waitState(t, r, sb, journal.StateReleased, 5*time.Second)
	if s.Exit == nil || s.Exit.Kind != journal.ExitNormal || s.Exit.Code != 3 || s.ProofOp != exitOp(cid) {
		t.Fatalf("released: exit %+v proof op %q, want code 3 under %s", s.Exit, s.ProofOp, exitOp(cid))
	}
	r.checkProof(exitOp(cid))
	r.checkClean("after the release on exit")
	checkUnjournaled(r, crashCase{})
}

// TestExitWhileNoPrimary: a guest that ends while no primary runs (the
// term ended, the next not started) is journaled as exited, with its code,
// by the next primary's reconcile (seen by the new epoch), and its
// on_exit release is made then; a keep generation stays exited, its
// watch-less crash stays lost as before (TestReconcileLostGeneration).
func TestExitWhileNoPrimary(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.exitPoll = 10 * time.Millisecond
	r := newRig(t, tk)
	r.mustBoot()
	rel := claimReq("c-rel", 1)
	rel.OnExit = journal.OnExitRelease
	relCID := r.mustClaim("rel", rel).Sandbox.ContainerID
	keepCID := r.mustClaim("keep", claimReq("c-keep", 1)).Sandbox.ContainerID
	// The term ends: no primary watches.
	r.end()
	r.n.Close()
	if err := k.ExitGuest(relCID, 9); err != nil {
		t.Fatal(err)
	}
	if err := k.ExitGuest(keepCID, 0); err != nil {
		t.Fatal(err)
	}
	r.mustBoot()
	s := waitState(t, r, "rel", journal.StateReleased, 5*time.Second)
	if s.Exit == nil || s.Exit.Code != 9 || s.Exit.SeenBy != r.epoch {
		t.Fatalf("rel: exit %+v, want code 9 seen by epoch %d", s.Exit, r.epoch)
	}
	r.checkProof(exitOp(relCID))
	if s := r.sandbox("keep"); s.State != journal.StateExited || s.Exit == nil || s.Exit.Code != 0 || s.Exit.Kind != journal.ExitNormal {
		t.Fatalf("keep: %s exit %+v, want exited code 0", s.State, s.Exit)
	}
	// A takeover keeps an exited generation as it is.
	r.mustBoot()
	if s := r.sandbox("keep"); s.State != journal.StateExited || s.Exit.SeenBy != r.epoch-1 {
		t.Fatalf("keep after a second takeover: %s exit %+v", s.State, s.Exit)
	}
	r.mustRelease("keep", "r-keep", 1)
	r.checkProof("r-keep")
	r.checkClean("after the releases")
	checkUnjournaled(r, crashCase{})
}
