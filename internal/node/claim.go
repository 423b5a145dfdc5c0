package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/runsc"
)

func requestHash(kind, id string, v any) string {
	b, _ := json.Marshal(v) // plain request structs always marshal
	h := sha256.Sum256(append([]byte(kind+"\x00"+id+"\x00"), b...))
	return hex.EncodeToString(h[:])
}

// beginOp runs create in the transaction that records op as pending, or
// returns the record of an op that ran already (op.Ops.Begin).
func (n *Node) beginOp(ctx context.Context, o journal.Operation, create func(*journal.Tx) error) (journal.Operation, bool, error) {
	return n.ops.Begin(ctx, o, create)
}

func (n *Node) endOp(id string) { n.ops.End(id) }

// opOutcome is a finished operation's stored answer (Answers) or error.
func opOutcome(o journal.Operation) (json.RawMessage, error) { return op.Outcome(o) }

// Claim makes a runtime generation for a sandbox and returns once its
// readiness proof arrived, with the answer stored for its operation
// (Answers.Claimed). req reaches it validated (api.ClaimRequest.Validate,
// names.CheckGeneration at the edge); Claim refuses only what needs this
// node's config or state.
func (n *Node) Claim(ctx context.Context, id string, req journal.ClaimRequest) (json.RawMessage, error) {
	cid := containerID(id, req.Generation)
	// Everything that can be refused is refused here, before the journal:
	// a bad request must never become a record and a rollback.
	if err := guest.LeaseSpec(cid, req.Resources, n.cfg.BootCPUMillis, n.cfg.RuntimePIDs).Validate(); err != nil {
		return nil, errdefs.Errorf(errdefs.CodeInvalidArgument, "lease: %v", err)
	}
	pol, err := n.net.Parse(req.Network)
	if err != nil {
		return nil, err
	}
	if err := n.net.Check(pol); err != nil {
		return nil, err
	}
	if err := n.applyImageDefaults(ctx, &req); err != nil {
		return nil, err
	}
	for _, e := range req.Process.Env {
		if strings.HasPrefix(e, runsc.AgentEnvPrefix) {
			return nil, errdefs.Errorf(errdefs.CodeInvalidArgument, "process env %q: %s is reserved for the guest agent", e, runsc.AgentEnvPrefix)
		}
	}
	if err := n.checkVolumes(ctx, req); err != nil {
		return nil, err
	}
	var lower string
	switch req.RootFS.Mode {
	case journal.RootFSOverlay:
		req.Resources = n.overlay.WithDiskDefault(req.Resources)
		if err := n.overlay.CheckDisk(req.Resources); err != nil {
			return nil, err
		}
		if lower, err = n.lowerDir(req.RootFS.Template); err != nil {
			return nil, err
		}
	case journal.RootFSBlock:
		// The disk lease is the device size: no project quota.
		if err := n.checkBlock(ctx, id, &req); err != nil {
			return nil, err
		}
	default:
		return nil, errdefs.Errorf(errdefs.CodeInvalidArgument, "rootfs mode %q is not supported", req.RootFS.Mode)
	}
	nonce, err := newNonce()
	if err != nil {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "%v", err)
	}
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	reqRec := req // the caller's converted request: node's to keep
	rec := journal.Sandbox{
		ID: id, Generation: req.Generation, State: journal.StateClaiming, ContainerID: cid, LeaseID: cid,
		Resources: reqRec.Resources, RootFS: reqRec.RootFS, Epoch: n.d.Epoch, CreatedAt: time.Now().UTC(),
		ClaimOp: req.OperationID, Nonce: nonce, Netns: cid, Bundle: n.bundleDir(cid), Request: &reqRec,
	}
	rec.RuntimePIDs = n.cfg.RuntimePIDs
	op := journal.Operation{
		ID: req.OperationID, Kind: journal.OpClaim, SandboxID: id, Generation: req.Generation,
		RequestHash: requestHash("claim", id, req), State: journal.OpPending, Epoch: n.d.Epoch, Created: time.Now().UTC(),
	}
	admitStart := time.Now()
	base := rec
	var started bool
	var member string              // the warm member the claim took ("": cold)
	var pooled bool                // the claim is one a warm pool serves
	var waitBound <-chan time.Time // the bound on waiting for a carrier being made
	displaced := 0                 // idle warm members destroyed for this claim to fit
	// Member boots wait while this claim runs (and a while after): a
	// boot beside a claim slows it (warmpool.go, claimBegins).
	n.claimBegins()
	defer n.claimEnds()
admit:
	for {
		rec = base
		changed := n.net.CarrierChanges()
		making := false
		member, pooled = "", false
		op, started, err = n.beginOp(ctx, op, func(tx *journal.Tx) error {
			// A warm member of the claim's pool, if there is one: it
			// brings its disk project, slot and every object but the
			// policy's (warmpool.go).
			var err error
			if member, pooled, err = n.takeWarm(tx, &rec); err != nil {
				return err
			}
			if member != "" {
				if err := n.admitClaim(tx, rec); err != nil {
					return err
				}
				if tab := n.policyTable(rec); len(tab) > 0 {
					return tx.PutEffect(n.run.Intended(tab[0].Spec().Kind, rec))
				}
				return nil
			}
			live, err := tx.Holders()
			if err != nil {
				return err
			}
			if making, err = n.allocCold(tx, live, &rec); err != nil {
				return err
			}
			if err := n.admitClaim(tx, rec); err != nil {
				return err
			}
			return n.intendFirst(tx, rec)
		})
		if errdefs.Is(err, errdefs.CodeCapacityExhausted) && displaced < maxDisplace && n.warmOn() {
			if n.displaceMember(ctx, n.log.With("sandbox", id, "generation", req.Generation), rec) {
				displaced++
				continue
			}
		}
		if !making {
			break
		}
		// The last free block is a carrier's being made: wait for it
		// (bounded) and take it, rather than refuse the claim.
		if waitBound == nil {
			t := time.NewTimer(n.net.CarrierWait())
			defer t.Stop()
			waitBound = t.C
		}
		n.log.Debug("claim waits for a warm carrier being made", "sandbox", id, "generation", req.Generation)
		select {
		case <-changed:
		case <-waitBound:
			break admit
		case <-ctx.Done():
			break admit
		}
	}
	rec.Timings.AdmitMS = ms(time.Since(admitStart))
	if err != nil || !started {
		if err != nil {
			return nil, err
		}
		return opOutcome(op)
	}
	defer n.endOp(op.ID)
	log := n.log.With("sandbox", id, "generation", req.Generation, "op", op.ID)

	var ready journal.Sandbox
	var cerr error
	if member != "" {
		log.Debug("claim takes a warm member", "member", member)
		ready, cerr = n.runWarmClaim(ctx, rec)
		var wf *warmClaimError
		if errors.As(cerr, &wf) && n.live() == nil && ctx.Err() == nil {
			// The member failed its claim (its guest died, its agent
			// does not answer): destroy it and claim cold, so a pool
			// never fails a claim that a cold one would pass.
			var fell bool
			if rec, fell, cerr = n.warmFallback(ctx, log, rec, base, member, wf.err); fell {
				member = ""
				ready, cerr = n.runClaim(ctx, rec, lower)
			}
		}
	} else {
		ready, cerr = n.runClaim(ctx, rec, lower)
	}
	if pooled {
		// A hit is a claim the member made ready; a fallback is a miss.
		n.countWarm(req.RootFS.Template, member != "" && cerr == nil)
	}
	if cerr == nil {
		log.Info("sandbox ready", "container", ready.ContainerID, "warm_member", member, "total_ms", ready.Timings.TotalMS)
		n.armExpiry(rec)
		n.watchExit(ctx, rec)
		return n.storedAnswer(op.ID)
	}
	if n.live() != nil {
		return nil, n.leftToSuccessor(log, op.ID, cerr)
	}
	log.Warn("claim failed, rolling back", "err", cerr)
	// Roll back without the caller's context (a cancelled request must not
	// leave half a generation behind) but within the term: after it, the
	// next primary's reconcile rolls back instead.
	rb, cancel := n.background(2 * time.Minute)
	defer cancel()
	rec, _ = n.sandbox(id)
	if _, err := n.teardown(rb, rec, op.ID, journal.StateFailed, cerr.Error()); err != nil {
		if n.live() != nil {
			return nil, n.leftToSuccessor(log, op.ID, errors.Join(cerr, err))
		}
		log.Error("rollback incomplete; capacity withheld", "err", err)
	}
	return nil, n.failOp(op, cerr)
}

// allocCold, in a claim's admitting transaction, gives a cold claim rec
// its disk project and address slot over holders (tx.Holders: a warm
// member's count), so two claims never pick the same one. making says the
// last free block is a warm carrier's being made (network.ErrCarrierMaking).
func (n *Node) allocCold(tx *journal.Tx, holders []journal.Sandbox, rec *journal.Sandbox) (making bool, err error) {
	if rootfsMode(*rec) == journal.RootFSOverlay {
		if rec.DiskProject, err = n.overlay.AllocDiskProject(holders); err != nil {
			return false, err
		}
	}
	// The address slot likewise (network): a warm carrier's if there is one.
	if err := n.net.TakeCarrier(tx, holders, rec); err != nil {
		return errors.Is(err, network.ErrCarrierMaking), err
	}
	return false, nil
}

// intendFirst journals the intended record of rec's first claim entry: it
// commits with the admission (makeEntries).
func (n *Node) intendFirst(tx *journal.Tx, rec journal.Sandbox) error {
	if tab := n.claimTable(rec); len(tab) > 0 {
		return tx.PutEffect(n.run.Intended(tab[0].Spec().Kind, rec))
	}
	return nil
}

// maxDisplace bounds the idle warm members one claim destroys to fit (a
// filler that boots into the room meanwhile cannot make it loop).
const maxDisplace = 64

// lowerDir is template's directory on this node (not_found: none).
func (n *Node) lowerDir(template string) (string, error) {
	lower := filepath.Join(n.cfg.TemplatesDir, template)
	if fi, err := os.Stat(lower); err != nil || !fi.IsDir() {
		return "", errdefs.Errorf(errdefs.CodeNotFound, "template %q not found on this node", template)
	}
	return lower, nil
}

// storedAnswer is the answer journaled with the finished operation id.
func (n *Node) storedAnswer(id string) (json.RawMessage, error) { return op.Stored(n.d.Journal, id) }

// admitClaim decides, inside the transaction that records the claim as
// pending, whether generation rec may start: no live generation, newer than
// the last, and it fits the ledger. It reads only live records (the
// journal's live index), so its cost does not grow with history.
func (n *Node) admitClaim(tx *journal.Tx, rec journal.Sandbox) error {
	id, req := rec.ID, rec.Request
	prev, ok, err := tx.Sandbox(id)
	if err != nil {
		return err
	}
	if ok && prev.Holds() {
		return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q already has generation %d in state %s", id, prev.Generation, prev.State)
	}
	if ok && prev.Withheld {
		return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d has unproven cleanup (withheld)", id, prev.Generation)
	}
	if ok && req.Generation <= prev.Generation {
		return errdefs.Errorf(errdefs.CodeConflict, "generation %d is not newer than the sandbox's generation %d", req.Generation, prev.Generation)
	}
	return n.admitFits(tx, rec)
}

// admitFits admits rec if it fits the ledger beside every other live
// generation and warm member (a record of rec's own generation, which it
// replaces, does not count: a warm claim falling back to cold) and its
// volumes are free, and journals it.
func (n *Node) admitFits(tx *journal.Tx, rec journal.Sandbox) error {
	all, err := tx.LiveSandboxes()
	if err != nil {
		return err
	}
	all = slices.DeleteFunc(all, func(s journal.Sandbox) bool { return s.ID == rec.ID && s.Generation == rec.Generation })
	// The warm members that stay (one this claim takes is gone already).
	members, err := tx.WarmMembers()
	if err != nil {
		return err
	}
	// The lease's pids.max, the runtime's allowance with the claim's.
	need := rec.Resources
	need.PIDs += rec.RuntimePIDs
	if ok, why := fits(ledger(n.d.Total, n.cfg.Reserve, all, members), need); !ok {
		return errdefs.Errorf(errdefs.CodeCapacityExhausted, "not enough allocatable capacity: %s", why)
	}
	if err := admitVolumes(all, rec); err != nil {
		return err
	}
	return tx.PutSandbox(rec)
}

// leftToSuccessor answers a claim cut short by the end of the term. Its
// records stay as they are (sandbox claiming, operation pending): the next
// primary's reconcile rolls it back and fails the operation.
func (n *Node) leftToSuccessor(log *slog.Logger, opID string, cause error) error {
	log.Warn("claim interrupted by the end of the term; rollback left to the next primary", "err", cause)
	return errdefs.Errorf(errdefs.CodeUnavailable, "claim %s interrupted: this primary's term ended; the next primary rolls it back; retry with a new operation_id", opID)
}

// failOp stores the operation's error so a retry gets the same answer.
func (n *Node) failOp(o journal.Operation, cause error) error { return n.ops.Fail(o, cause) }

// effects are tab's entries as the runner makes them for claim c.
func effects(tab []entry, c *resource.Claim) []op.Effect {
	out := make([]op.Effect, len(tab))
	for i, r := range tab {
		out[i] = op.Effect{Kind: r.Spec().Kind, Make: func(ctx context.Context) (func(*journal.Tx) error, error) {
			if err := r.Make(ctx, c); err != nil {
				return nil, err
			}
			return c.TakeStaged(), nil
		}}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (n *Node) runClaim(ctx context.Context, rec journal.Sandbox, lower string) (journal.Sandbox, error) {
	cid := rec.ContainerID
	t := journal.Timings{AdmitMS: rec.Timings.AdmitMS}
	phase := n.table.Phases(&t)
	start := time.Now()

	// Make the generation's resources in table order, each journaled.
	c := &resource.Claim{Rec: rec, Lower: lower}
	err := n.run.MakeAll(ctx, rec, effects(n.claimTable(rec), c), func(kind journal.Kind, took time.Duration) {
		d := ms(took)
		t.Steps = append(t.Steps, journal.StepTiming{Resource: string(kind), MakeMS: d})
		if p := phase[kind]; p != nil {
			*p += d
		}
	})
	if err != nil {
		return journal.Sandbox{}, err
	}
	rec, root := c.Rec, c.Root
	step := time.Now()

	// Readiness proof: the guest's agent, the init that started the
	// workload, must answer with this generation's nonce; the boot CPU
	// allowance ends before the generation is published.
	nonce, err := n.guest.Ready(ctx, rec)
	if err != nil {
		return journal.Sandbox{}, err
	}
	ready, err := n.acceptReadiness(Readiness{SandboxID: rec.ID, Generation: rec.Generation, ContainerID: cid, Nonce: nonce}, func(s *journal.Sandbox) {
		t.ProofMS = ms(time.Since(step))
		t.TotalMS = ms(time.Since(start))
		s.Root, s.Timings = root, t
	})
	return ready, err
}

// Readiness is a proof that a generation's guest runs: it returned the
// nonce of (sandbox, generation, container).
type Readiness struct {
	SandboxID, ContainerID, Nonce string
	Generation                    uint64
}

// acceptReadiness publishes the generation as ready, in the same
// transaction as its claim operation's result, only if the proof matches
// the sandbox's current generation, container and nonce. A late proof from
// an older attempt is rejected.
func (n *Node) acceptReadiness(r Readiness, finish func(*journal.Sandbox)) (journal.Sandbox, error) {
	var out journal.Sandbox
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		s, ok, err := tx.Sandbox(r.SandboxID)
		if err != nil {
			return err
		}
		switch {
		case !ok:
			return errdefs.Errorf(errdefs.CodeNotFound, "readiness proof for unknown sandbox %q", r.SandboxID)
		case s.Generation != r.Generation || s.ContainerID != r.ContainerID:
			return errdefs.Errorf(errdefs.CodeFenced, "late readiness proof for generation %d (container %s) rejected: current is generation %d", r.Generation, r.ContainerID, s.Generation)
		case s.State != journal.StateClaiming:
			return errdefs.Errorf(errdefs.CodeFenced, "readiness proof for generation %d rejected: state is %s", r.Generation, s.State)
		case r.Nonce != s.Nonce:
			return errdefs.Errorf(errdefs.CodeFenced, "readiness proof for generation %d rejected: nonce mismatch", r.Generation)
		}
		finish(&s)
		s.State = journal.StateReady
		if err := tx.PutSandbox(s); err != nil {
			return err
		}
		op, ok, err := tx.Operation(s.ClaimOp)
		if err != nil || !ok {
			return fmt.Errorf("claim operation %s of %s missing: %v", s.ClaimOp, s.ID, err)
		}
		res, err := n.d.Answers.Claimed(s)
		if err != nil {
			return fmt.Errorf("encode the answer of claim %s: %w", s.ClaimOp, err)
		}
		op.State, op.Result = journal.OpDone, res
		out = s
		return tx.PutOperation(op)
	})
	if err != nil {
		var ae *errdefs.Error
		if errors.As(err, &ae) {
			return out, ae
		}
		return out, fmt.Errorf("publish ready: %w", err)
	}
	return out, nil
}
