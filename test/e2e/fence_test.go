package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ha"
)

// waitLog waits until slot's log has a line containing substr.
func (e *env) waitLog(slot, substr string, d time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		logs, _ := filepath.Glob(filepath.Join(filepath.Dir(e.stateDir), "ctld-"+slot+"-*.log"))
		for _, l := range logs {
			if b, _ := os.ReadFile(l); strings.Contains(string(b), substr) {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("ctld@%s did not log %q within %v", slot, substr, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTermEndCancelsClaimAndLeavesRollbackToSuccessor: SIGTERM reaches the
// primary while a claim is between two effects (the lease and the RootFS are
// made, the netns is next). The term ends: the claim makes no further kernel
// effect and does not roll back itself (that would be kernel work after the
// term); the primary waits for it, then releases the lock; the standby's
// reconcile rolls the claim back under its own epoch.
func TestTermEndCancelsClaimAndLeavesRollbackToSuccessor(t *testing.T) {
	e := newEnv(t)
	e.start("a", "CTLD_TEST_STALL_AT=mount:made", "CTLD_TEST_STALL_FOR=4s")
	na := e.waitPrimary("a", 60*time.Second)
	e.start("b")
	e.waitRole("b", ha.RoleStandby, time.Minute)
	c := e.client()
	cx := ctx(t, 3*time.Minute)
	claimed := make(chan error, 1)
	go func() {
		_, err := c.Claim(cx, "termend", claimReq("claim-termend", 1))
		claimed <- err
	}()
	e.waitLog("a", "test stall point reached", time.Minute)
	cid := "termend-g1"
	nsPath := filepath.Join("/run/netns", "ctld-"+cid)
	a := e.procs["a"]
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Until a has exited, watch for the next effect of the claim.
	exited := make(chan struct{})
	go func() { a.Wait(); close(exited) }()
	var effectAfterTerm string
watch:
	for {
		select {
		case <-exited:
			break watch
		case <-time.After(60 * time.Second):
			t.Fatal("ctld@a did not exit within 60s of SIGTERM")
		case <-time.After(5 * time.Millisecond):
			if _, err := os.Stat(nsPath); err == nil && effectAfterTerm == "" {
				effectAfterTerm = "netns " + nsPath + " created"
			}
			if _, err := os.Stat(filepath.Join(e.runDir, "bundles", cid)); err == nil && effectAfterTerm == "" {
				effectAfterTerm = "bundle written"
			}
		}
	}
	delete(e.procs, "a")
	if a.ProcessState.ExitCode() != 0 {
		t.Errorf("ctld@a exit after SIGTERM: %v, want 0 (clean drain)", a.ProcessState)
	}
	if effectAfterTerm != "" {
		t.Fatalf("after SIGTERM the old primary went on: %s", effectAfterTerm)
	}
	err := <-claimed
	if codeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("claim cut by the end of the term: %v, want unavailable", err)
	}
	e.dumpLogs("rollback left to the next primary")
	nb := e.waitPrimary("b", 60*time.Second)
	sb, err := c.Get(cx, "termend")
	if err != nil || sb.State != api.StateFailed {
		t.Fatalf("after takeover: %+v, %v; want failed (rolled back by the new primary)", sb, err)
	}
	p, err := c.Proof(cx, "claim-termend")
	if err != nil || !p.Clean {
		t.Fatalf("rollback proof: %+v, %v", p, err)
	}
	if p.Epoch != nb.Epoch || p.Epoch == na.Epoch {
		t.Fatalf("rollback proof epoch %d: want the new primary's %d, not the old %d", p.Epoch, nb.Epoch, na.Epoch)
	}
	if _, err := c.Claim(cx, "termend", claimReq("claim-termend", 1)); codeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("retry of the interrupted claim: %v, want its stored unavailable", err)
	}
	if n, _ := c.Node(cx); n.Capacity.Leased != (api.Capacity{}) || n.Capacity.Withheld != (api.Capacity{}) {
		t.Fatalf("capacity after the rollback: leased %+v withheld %+v", n.Capacity.Leased, n.Capacity.Withheld)
	}
}
