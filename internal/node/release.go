package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
)

// Release destroys a sandbox's current generation and returns the answer
// stored with its signed cleanup proof (Answers.Released).
func (n *Node) Release(ctx context.Context, id string, req ReleaseRequest) (json.RawMessage, error) {
	o := journal.Operation{
		ID: req.OperationID, Kind: journal.OpRelease, SandboxID: id, Generation: req.Generation,
		RequestHash: requestHash("release", id, req), State: journal.OpPending, Epoch: n.d.Epoch, Created: time.Now().UTC(),
	}
	ctx, end, err := n.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	var rec journal.Sandbox
	// A network update in flight finishes before the generation leaves
	// ready (network_update.go).
	unlock := n.lockSandbox(id)
	got, started, err := n.beginOp(ctx, o, func(tx *journal.Tx) error {
		s, err := op.Current(tx, id, req.Generation, "release")
		if err != nil {
			return err
		}
		switch s.State {
		case journal.StateReady, journal.StateLost, journal.StateExited:
		case journal.StateClaiming, journal.StateReleasing:
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s", id, s.Generation, s.State)
		default:
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is already %s", id, s.Generation, s.State)
		}
		s.State, s.ReleaseOp = journal.StateReleasing, req.OperationID
		rec = s
		return tx.PutSandbox(s)
	})
	unlock()
	if err != nil || !started {
		if err != nil {
			return nil, err
		}
		return opOutcome(got)
	}
	defer n.endOp(o.ID)
	// Not stopped by the caller going away, but by the end of the term.
	td, cancel := n.background(2 * time.Minute)
	defer cancel()
	_, terr := n.teardown(td, rec, o.ID, journal.StateReleased, "released")
	n.kickCarriers() // a slot may be free again
	if errors.Is(terr, ErrTermOver) {
		n.log.Warn("release interrupted by the end of the term; the next primary completes it", "sandbox", id, "generation", rec.Generation, "err", terr)
		return nil, errdefs.Errorf(errdefs.CodeUnavailable, "release %s interrupted: this primary's term ended; the next primary completes it; retry the same operation_id", o.ID)
	}
	if terr != nil {
		n.log.Warn("release left objects behind; capacity withheld", "sandbox", id, "generation", rec.Generation, "err", terr)
	}
	// The answer is what the journal stored with the proof, so a repeat of
	// this operation id gets exactly the same bytes.
	ans, err := n.storedAnswer(o.ID)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "release of %s: cleanup proof not journaled: %v", id, errors.Join(err, terr))
	}
	return ans, nil
}

// teardown removes the kernel objects of a generation (idempotently, in
// reverse table order), checks each is physically gone, signs the cleanup
// proof and, in one journal transaction, stores it, ends the generation
// (state final, or withheld if any check failed, which keeps its capacity
// out), forgets its effect records if the proof is clean, and completes the
// operation opID.
//
// The journal says what to remove: an entry with an effect record
// (intended, done or removing) is removed; one without was never started
// and is only checked. A check that finds an object the journal never saw
// removes it (the second line of defence) and reports it as unjournaled.
func (n *Node) teardown(ctx context.Context, rec journal.Sandbox, opID string, final journal.State, reason string) (proof.Proof, error) {
	start := time.Now()
	log := n.log.With("sandbox", rec.ID, "generation", rec.Generation, "op", opID)
	rec = n.identify(ctx, rec)
	// Usage metering's final record, while the cgroup and the counters
	// are there to read and before the proof returns the capacity.
	finalUsage := n.meterFinal(ctx, rec)
	tab := n.tableFor(rec)
	recorded, err := n.effectsOf(rec)
	if err != nil {
		// Fail safe: without the journal's word, remove everything
		// (removal is idempotent).
		log.Error("read effect records; removing every resource", "err", err)
		recorded = map[journal.Kind]journal.Effect{}
		for _, r := range tab {
			recorded[r.Spec().Kind] = journal.Effect{Kind: r.Spec().Kind, State: journal.Intended}
		}
	}
	steps, errs, over := n.removeRecordedAll(ctx, tab, rec, recorded)
	if over != nil {
		// No proof and no final state: the generation stays claiming or
		// releasing in the journal, and the next primary's reconcile
		// tears it down again (every step is idempotent).
		log.Warn("teardown stopped by the end of the term", "err", over)
		return proof.Proof{}, errors.Join(append(errs, over)...)
	}

	p := n.checkGone(ctx, tab, rec, opID, recorded, steps)
	proofStart := time.Now()
	if err := proof.Sign(n.d.Identity, &p); err != nil {
		errs = append(errs, fmt.Errorf("sign proof: %w", err))
	}
	n.crash("proof:signed")
	if err := n.live(); err != nil {
		log.Warn("teardown stopped by the end of the term before its proof was journaled", "err", err)
		return proof.Proof{}, errors.Join(append(errs, err)...)
	}
	err = n.d.Journal.Update(func(tx *journal.Tx) error {
		s, ok, err := tx.Sandbox(rec.ID)
		if err != nil {
			return err
		}
		if !ok || s.Generation != rec.Generation {
			return fmt.Errorf("sandbox %s generation %d vanished from the journal", rec.ID, rec.Generation)
		}
		// No proof without the generation's final usage record.
		if err := n.meterFinalLocked(tx, rec, finalUsage); err != nil {
			return err
		}
		if err := tx.PutProof(p); err != nil {
			return err
		}
		s.State, s.Reason, s.ProofOp = final, reason, opID
		s.Withheld = !p.Clean // a clean retry of a withheld generation returns its capacity
		if !p.Clean {
			s.Reason = reason + "; cleanup unproven: " + failedChecks(p)
		}
		s.ReleaseTimings = &journal.ReleaseTimings{Steps: steps, ProofMS: ms(time.Since(proofStart)), TotalMS: ms(time.Since(start))}
		if p.Clean {
			// Proven gone: the effect records have nothing left to say.
			// An unclean proof keeps them for the retries.
			for _, r := range n.table.All() {
				if err := tx.DeleteEffect(r.Spec().Kind, rec.ContainerID); err != nil {
					return err
				}
			}
		}
		if err := tx.PutSandbox(s); err != nil {
			return err
		}
		op, ok, err := tx.Operation(opID)
		if err != nil || !ok || (op.Kind != journal.OpRelease && op.Kind != journal.OpPause) {
			return err // claim rollbacks store their error in failOp
		}
		var res json.RawMessage
		if op.Kind == journal.OpPause {
			res, err = n.d.Answers.Paused(s, p)
		} else {
			res, err = n.d.Answers.Released(s, p)
		}
		if err != nil {
			return fmt.Errorf("encode the answer of %s %s: %w", op.Kind, opID, err)
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
		log.Info("generation cleaned up", "state", final, "total_ms", ms(time.Since(start)))
	}
	return p, errors.Join(errs...)
}

// removeRecordedAll removes, in reverse table order, the entries of tab
// that rec's generation has effect records of (removeRecorded), and times
// each. over is the end of the term, which stops it: the rest is the next
// primary's.
func (n *Node) removeRecordedAll(ctx context.Context, tab []entry, rec journal.Sandbox, recorded map[journal.Kind]journal.Effect) (steps []journal.StepTiming, errs []error, over error) {
	steps = make([]journal.StepTiming, 0, len(tab))
	for _, r := range slices.Backward(tab) {
		st := journal.StepTiming{Resource: string(r.Spec().Kind)}
		if e, ok := recorded[r.Spec().Kind]; ok {
			if over = n.live(); over != nil {
				break
			}
			t0 := time.Now()
			if err := n.removeRecorded(ctx, r, rec, e); err != nil {
				errs = append(errs, fmt.Errorf("remove %s %s: %w", r.Spec().Kind, rec.ContainerID, err))
			}
			st.RemoveMS = ms(time.Since(t0))
		}
		steps = append(steps, st)
	}
	if over == nil && len(errs) > 0 {
		// A step that failed as the term ended was likely cut short by it:
		// the successor decides, rather than an unproven proof of ours.
		over = n.live()
	}
	return steps, errs, over
}

// effectsOf returns the effect records of rec's generation by kind.
func (n *Node) effectsOf(rec journal.Sandbox) (map[journal.Kind]journal.Effect, error) {
	out := map[journal.Kind]journal.Effect{}
	err := n.d.Journal.View(func(tx *journal.Tx) error {
		for _, r := range n.table.All() {
			e, ok, err := tx.Effect(r.Spec().Kind, rec.ContainerID)
			if err != nil {
				return err
			}
			if ok && e.SandboxID == rec.ID && e.Generation == rec.Generation {
				out[r.Spec().Kind] = e
			}
		}
		return nil
	})
	return out, err
}

// removeRecorded removes one journaled resource of a generation: journaled
// as removing first (a successor finishes what this one started).
func (n *Node) removeRecorded(ctx context.Context, r entry, rec journal.Sandbox, e journal.Effect) error {
	if e.State != journal.Removing {
		e = journal.Effect{Kind: r.Spec().Kind, Name: rec.ContainerID, SandboxID: rec.ID, Generation: rec.Generation, State: journal.Removing, Epoch: n.d.Epoch, Slot: rec.Slot}
		if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutEffect(e) }); err != nil {
			return fmt.Errorf("journal removing: %w", err)
		}
	}
	n.crash(string(r.Spec().Kind) + ":removing")
	if err := n.live(); err != nil {
		return err
	}
	if err := r.Remove(ctx, rec); err != nil {
		return err
	}
	n.crash(string(r.Spec().Kind) + ":removed")
	return nil
}

// checkGone asks the kernel, per entry, whether the generation is gone,
// and fills in each step's check time. An object found that the journal
// never recorded is removed here and reported (see teardown).
func (n *Node) checkGone(ctx context.Context, tab []entry, rec journal.Sandbox, opID string, recorded map[journal.Kind]journal.Effect, steps []journal.StepTiming) proof.Proof {
	p := proof.Proof{
		OperationID: opID, NodeID: n.d.Identity.NodeID, BootID: n.d.Identity.BootID, Epoch: n.d.Epoch,
		SandboxID: rec.ID, Generation: rec.Generation, LeaseID: rec.LeaseID, Time: time.Now().UTC(),
	}
	for i, r := range slices.Backward(tab) {
		t0 := time.Now()
		_, journaled := recorded[r.Spec().Kind]
		c := r.Gone(ctx, rec)
		if !resource.Present(r) {
			// Its subsystem is not configured: nothing of it can exist
			// unless the journal says an earlier term made it.
			c = resource.AbsentCheck(r.Spec(), journaled)
		} else if !journaled && !c.OK && n.live() == nil {
			n.unjournaledFound(r.Spec().Kind, rec.ContainerID, "proof check of "+rec.ContainerID)
			if err := r.Remove(ctx, rec); err != nil {
				c.Detail += "; remove: " + err.Error()
			} else {
				c = r.Gone(ctx, rec)
			}
		}
		steps[len(tab)-1-i].CheckMS = ms(time.Since(t0))
		p.Checks = append(p.Checks, c)
	}
	p.Clean = true
	for _, c := range p.Checks {
		p.Clean = p.Clean && c.OK
	}
	return p
}

func failedChecks(p proof.Proof) string {
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
