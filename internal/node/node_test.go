package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

func testNode(t *testing.T) *Node {
	t.Helper()
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := j.TakeOver(3); err != nil {
		t.Fatal(err)
	}
	return New(Config{Slot: "a"}, Deps{Journal: j, Answers: testAnswers{}, Epoch: 3})
}

// TestLateReadinessProofRejected: a proof from an older attempt (another
// generation or container, or a wrong nonce) must not publish the sandbox.
func TestLateReadinessProofRejected(t *testing.T) {
	n := testNode(t)
	rec := journal.Sandbox{
		ID: "sb", Generation: 2, State: journal.StateClaiming, ContainerID: "sb-g2",
		ClaimOp: "op2", Nonce: "n2",
	}
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		if err := tx.PutSandbox(rec); err != nil {
			return err
		}
		return tx.PutOperation(journal.Operation{ID: "op2", Kind: "claim", State: journal.OpPending})
	})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(*journal.Sandbox) {}
	for name, r := range map[string]Readiness{
		"older generation": {SandboxID: "sb", Generation: 1, ContainerID: "sb-g1", Nonce: "n1"},
		"other container":  {SandboxID: "sb", Generation: 2, ContainerID: "sb-g1", Nonce: "n2"},
		"wrong nonce":      {SandboxID: "sb", Generation: 2, ContainerID: "sb-g2", Nonce: "n1"},
	} {
		if _, err := n.acceptReadiness(r, noop); errdefs.CodeOf(err) != errdefs.CodeFenced {
			t.Errorf("%s: %v, want fenced", name, err)
		}
	}
	if s, _ := n.sandbox("sb"); s.State != journal.StateClaiming {
		t.Fatalf("a rejected proof changed the state to %s", s.State)
	}
	s, err := n.acceptReadiness(Readiness{SandboxID: "sb", Generation: 2, ContainerID: "sb-g2", Nonce: "n2"}, noop)
	if err != nil || s.State != journal.StateReady {
		t.Fatalf("matching proof: %+v, %v", s, err)
	}
	var op journal.Operation
	n.d.Journal.View(func(tx *journal.Tx) (err error) { op, _, err = tx.Operation("op2"); return err })
	if op.State != journal.OpDone {
		t.Fatalf("claim operation is %s after readiness, want done in the same transaction", op.State)
	}
	// A second (late, duplicate) proof for the now-ready generation is refused.
	if _, err := n.acceptReadiness(Readiness{SandboxID: "sb", Generation: 2, ContainerID: "sb-g2", Nonce: "n2"}, noop); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("duplicate proof: %v, want fenced", err)
	}
}

func TestLedgerReturnsCapacityOnlyOnCleanProof(t *testing.T) {
	total := Capacity{CPUMillis: 4000, MemoryBytes: 8 << 30, PIDs: 10000}
	reserve := Capacity{CPUMillis: 500, MemoryBytes: 1 << 30, PIDs: 1000}
	res := journal.Resources{CPUMillis: 1000, MemoryBytes: 1 << 30, PIDs: 100}
	sb := func(state journal.State, withheld bool) journal.Sandbox {
		return journal.Sandbox{State: state, Resources: res, Withheld: withheld}
	}
	c := ledger(total, reserve, []journal.Sandbox{
		sb(journal.StateReady, false), sb(journal.StateClaiming, false), sb(journal.StateReleasing, false),
		sb(journal.StateReleased, false), sb(journal.StateFailed, false), sb(journal.StateReleased, true),
	}, nil)
	if c.Allocatable.CPUMillis != 3500 || c.Leased.CPUMillis != 3000 || c.Withheld.CPUMillis != 1000 {
		t.Fatalf("ledger = %+v; want allocatable 3500m, leased 3000m (ready+claiming+releasing), withheld 1000m", c)
	}
	if ok, why := fits(c, journal.Resources{CPUMillis: 1}); ok {
		t.Fatalf("a claim fits although leased+withheld exceed allocatable")
	} else if why == "" {
		t.Fatal("no reason given")
	}
	c = ledger(total, reserve, []journal.Sandbox{sb(journal.StateReady, false)}, nil)
	if ok, _ := fits(c, journal.Resources{CPUMillis: 2500, MemoryBytes: 6 << 30, PIDs: 8900}); !ok {
		t.Fatal("a claim of exactly the free capacity must fit")
	}
	if ok, why := fits(c, journal.Resources{CPUMillis: 2500, MemoryBytes: 6<<30 + 1, PIDs: 1}); ok {
		t.Fatal("memory over free must not fit")
	} else {
		t.Log(why)
	}
}

func TestArmExpiryOnlyWithLifetimeAndCloseStopsTimers(t *testing.T) {
	n := testNode(t)
	base := journal.Sandbox{ID: "sb", Generation: 1, ContainerID: "sb-g1", CreatedAt: time.Now()}
	n.armExpiry(base) // no request recorded
	noLife := base
	noLife.Request = &journal.ClaimRequest{}
	n.armExpiry(noLife)
	if len(n.timers) != 0 {
		t.Fatalf("timers armed without a max lifetime: %d", len(n.timers))
	}
	withLife := base
	withLife.Request = &journal.ClaimRequest{MaxLifetimeSec: 3600}
	n.armExpiry(withLife)
	n.armExpiry(withLife) // re-arming replaces, never doubles
	if len(n.timers) != 1 {
		t.Fatalf("want one timer, have %d", len(n.timers))
	}
	n.Close()
	if len(n.timers) != 0 {
		t.Fatal("Close left timers")
	}
	n.armExpiry(withLife)
	if len(n.timers) != 0 {
		t.Fatal("a closed node armed a timer")
	}
}

// TestBadClaimNeverReachesJournal: a claim the lease would refuse is
// refused before the journal, so it leaves no operation, no sandbox record
// and no rollback (it was once journaled, then failed in runClaim).
func TestBadClaimNeverReachesJournal(t *testing.T) {
	n := testNode(t)
	n.cfg.TemplatesDir = t.TempDir()
	n.d.Total = Capacity{CPUMillis: 1 << 40, MemoryBytes: 1 << 62, PIDs: 1 << 40}
	if err := os.Mkdir(filepath.Join(n.cfg.TemplatesDir, "busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	good := journal.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 64}
	for name, c := range map[string]struct {
		id  string
		gen uint64
		res func(*journal.Resources)
	}{
		"cpu below the kernel's quota minimum": {"sb", 1, func(r *journal.Resources) { r.CPUMillis = 5 }},
		"cpuset beyond NR_CPUS":                {"sb", 1, func(r *journal.Resources) { r.Cpuset = "9000" }},
		"memory beyond the limit":              {"sb", 1, func(r *journal.Resources) { r.MemoryBytes = 1 << 60 }},
		"generation name too long":             {strings.Repeat("a", 60), 10, func(*journal.Resources) {}},
	} {
		res := good
		c.res(&res)
		req := journal.ClaimRequest{
			OperationID: "op-" + strings.ReplaceAll(name, " ", "-"), Generation: c.gen,
			RootFS: journal.RootFS{Mode: "overlay", Template: "busybox"}, Resources: res,
		}
		if _, err := n.Claim(context.Background(), c.id, req); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%s: claim = %v, want invalid_argument", name, err)
		}
		var ops []journal.Operation
		var sbs []journal.Sandbox
		var effs []journal.Effect
		if err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
			if ops, err = tx.Operations(); err != nil {
				return err
			}
			if effs, err = tx.Effects(); err != nil {
				return err
			}
			sbs, err = tx.Sandboxes()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(ops)+len(sbs)+len(effs) != 0 {
			t.Fatalf("%s: a refused claim reached the journal: operations %+v sandboxes %+v effects %+v", name, ops, sbs, effs)
		}
	}
}
