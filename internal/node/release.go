package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node/journal"
)

// Release destroys a sandbox's current generation and returns the signed
// cleanup proof.
func (n *Node) Release(ctx context.Context, id string, req api.ReleaseRequest) (api.ReleaseResponse, error) {
	op := journal.Operation{
		ID: req.OperationID, Kind: "release", SandboxID: id, Generation: req.Generation,
		RequestHash: requestHash("release", id, req), State: journal.OpPending, Epoch: n.d.Epoch, Created: time.Now().UTC(),
	}
	ctx, end, err := n.begin(ctx)
	if err != nil {
		return api.ReleaseResponse{}, err
	}
	defer end()
	var rec journal.Sandbox
	op, started, err := n.beginOp(ctx, op, func(tx *journal.Tx) error {
		s, ok, err := tx.Sandbox(id)
		if err != nil {
			return err
		}
		if !ok {
			return errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", id)
		}
		if req.Generation != 0 && req.Generation != s.Generation {
			return errdefs.Errorf(errdefs.CodeFenced, "release of generation %d refused: current generation is %d", req.Generation, s.Generation)
		}
		switch s.State {
		case api.StateReady, api.StateLost:
		case api.StateClaiming, api.StateReleasing:
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s", id, s.Generation, s.State)
		default:
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is already %s", id, s.Generation, s.State)
		}
		s.State, s.ReleaseOp = api.StateReleasing, req.OperationID
		rec = s
		return tx.PutSandbox(s)
	})
	if err != nil || !started {
		if err != nil {
			return api.ReleaseResponse{}, err
		}
		return opOutcome[api.ReleaseResponse](op)
	}
	defer n.endOp(op.ID)
	// Not stopped by the caller going away, but by the end of the term.
	td, cancel := n.background(2 * time.Minute)
	defer cancel()
	_, terr := n.teardown(td, rec, op.ID, api.StateReleased, "released")
	if errors.Is(terr, ErrTermOver) {
		n.log.Warn("release interrupted by the end of the term; the next primary completes it", "sandbox", id, "generation", rec.Generation, "err", terr)
		return api.ReleaseResponse{}, errdefs.Errorf(errdefs.CodeUnavailable, "release %s interrupted: this primary's term ended; the next primary completes it; retry the same operation_id", op.ID)
	}
	if terr != nil {
		n.log.Warn("release left objects behind; capacity withheld", "sandbox", id, "generation", rec.Generation, "err", terr)
	}
	// The answer is what the journal stored with the proof, so a repeat of
	// this operation id gets exactly the same bytes.
	var done journal.Operation
	var ok bool
	if jerr := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		done, ok, err = tx.Operation(op.ID)
		return err
	}); jerr != nil || !ok || done.State != journal.OpDone {
		return api.ReleaseResponse{}, errdefs.Errorf(errdefs.CodeInternal, "release of %s: cleanup proof not journaled: %v", id, errors.Join(jerr, terr))
	}
	return opOutcome[api.ReleaseResponse](done)
}

// teardown removes every kernel object of a generation (idempotently, in
// reverse claim order), checks each is physically gone, signs the cleanup
// proof and, in one journal transaction, stores it, ends the generation
// (state final, or withheld if any check failed, which keeps its capacity
// out) and completes the operation opID.
func (n *Node) teardown(ctx context.Context, rec journal.Sandbox, opID, final, reason string) (api.CleanupProof, error) {
	cid := rec.ContainerID
	log := n.log.With("sandbox", rec.ID, "generation", rec.Generation, "op", opID)
	rec = n.identify(ctx, rec)
	var errs []error
	var over error // the term ended: stop, leave the rest to the next primary
	remove := func(kind, name string, fn func() error) {
		if over != nil {
			return
		}
		if over = n.live(); over != nil {
			return
		}
		n.markRemoving(kind, name, rec)
		if err := fn(); err != nil {
			errs = append(errs, fmt.Errorf("remove %s %s: %w", kind, name, err))
			return
		}
		if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.DeleteEffect(kind, name) }); err != nil {
			errs = append(errs, err)
		}
	}
	remove(journal.KindRunsc, cid, func() error {
		_ = n.d.Runtime.Kill(ctx, cid, syscall.SIGKILL, true)
		return n.d.Runtime.Delete(ctx, cid)
	})
	remove(journal.KindBundle, cid, func() error { return os.RemoveAll(n.bundleDir(cid)) })
	remove(journal.KindNetns, cid, func() error { return n.d.Netns.Delete(ctx, cid) })
	remove(journal.KindMount, cid, func() error { return n.d.RootFS.Unmount(ctx, cid) })
	remove(journal.KindDisk, cid, func() error { return n.d.RootFS.UnlimitDisk(ctx, rec.DiskProject) })
	remove(journal.KindCgroup, cid, func() error { return n.d.Leases.Remove(ctx, cid) })
	remove(journal.KindLogs, cid, func() error { return n.removeLogs(ctx, cid) })
	if over == nil && len(errs) > 0 {
		// A step that failed as the term ended was likely cut short by it:
		// the successor decides, rather than an unproven proof of ours.
		over = n.live()
	}
	if over != nil {
		// No proof and no final state: the generation stays claiming or
		// releasing in the journal, and the next primary's reconcile
		// tears it down again (every step is idempotent).
		log.Warn("teardown stopped by the end of the term", "err", over)
		return api.CleanupProof{}, errors.Join(append(errs, over)...)
	}

	p := n.checkGone(ctx, rec, opID)
	if err := n.signProof(&p); err != nil {
		errs = append(errs, fmt.Errorf("sign proof: %w", err))
	}
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		s, ok, err := tx.Sandbox(rec.ID)
		if err != nil {
			return err
		}
		if !ok || s.Generation != rec.Generation {
			return fmt.Errorf("sandbox %s generation %d vanished from the journal", rec.ID, rec.Generation)
		}
		if err := tx.PutProof(p); err != nil {
			return err
		}
		s.State, s.Reason, s.ProofOp = final, reason, opID
		s.Withheld = !p.Clean // a clean retry of a withheld generation returns its capacity
		if !p.Clean {
			s.Reason = reason + "; cleanup unproven: " + failedChecks(p)
		}
		if err := tx.PutSandbox(s); err != nil {
			return err
		}
		op, ok, err := tx.Operation(opID)
		if err != nil || !ok || op.Kind != "release" {
			return err // claim rollbacks store their error in failOp
		}
		res, err := json.Marshal(api.ReleaseResponse{Sandbox: s.Sandbox, Proof: p})
		if err != nil {
			return err
		}
		op.State, op.Result = journal.OpDone, res
		return tx.PutOperation(op)
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("journal cleanup proof: %w", err))
	}
	if !p.Clean {
		errs = append(errs, fmt.Errorf("cleanup unproven: %s", failedChecks(p)))
	}
	if len(errs) == 0 {
		log.Info("generation cleaned up", "state", final)
	}
	return p, errors.Join(errs...)
}

func (n *Node) markRemoving(kind, name string, rec journal.Sandbox) {
	e := journal.Effect{Kind: kind, Name: name, SandboxID: rec.ID, Generation: rec.Generation, State: journal.Removing, Epoch: n.d.Epoch}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutEffect(e) }); err != nil {
		n.log.Error("journal removing", "kind", kind, "name", name, "err", err)
	}
}

// checkGone asks the kernel, per object, whether the generation is gone.
func (n *Node) checkGone(ctx context.Context, rec journal.Sandbox, opID string) api.CleanupProof {
	cid := rec.ContainerID
	p := api.CleanupProof{
		OperationID: opID, NodeID: n.d.Identity.NodeID, BootID: n.d.Identity.BootID, Epoch: n.d.Epoch,
		SandboxID: rec.ID, Generation: rec.Generation, LeaseID: rec.LeaseID, Time: time.Now().UTC(),
	}
	check := func(name string, ok bool, detail string) {
		p.Checks = append(p.Checks, api.ProofCheck{Name: name, OK: ok, Detail: detail})
	}
	ok, d := n.d.Leases.CheckGone(ctx, rec.LeaseID)
	check("cgroup_removed", ok, d)
	ok, d = n.d.Runtime.CheckGone(ctx, cid)
	check("runsc_container_gone", ok, d)
	ok, d = n.d.RootFS.CheckGone(ctx, cid, rec.RootDev)
	check("mounts_gone", ok, d)
	ok, d = n.d.Netns.CheckGone(ctx, cid, netnsID(rec))
	check("netns_gone", ok, d)
	ok, d = n.d.RootFS.CheckDiskGone(ctx, rec.DiskProject)
	check("disk_quota_cleared", ok, d)
	_, err := os.Stat(n.bundleDir(cid))
	check("bundle_removed", os.IsNotExist(err), n.bundleDir(cid)+" "+errString(err))
	ok, d = n.logDirs().CheckGone(cid)
	check("logs_removed", ok, d)
	p.Clean = true
	for _, c := range p.Checks {
		p.Clean = p.Clean && c.OK
	}
	return p
}

func errString(err error) string {
	switch {
	case err == nil:
		return "exists"
	case os.IsNotExist(err):
		return "absent"
	}
	return err.Error()
}

func failedChecks(p api.CleanupProof) string {
	var s string
	for _, c := range p.Checks {
		if !c.OK {
			if s != "" {
				s += ", "
			}
			s += c.Name
			if c.Detail != "" {
				s += " (" + c.Detail + ")"
			}
		}
	}
	return s
}
