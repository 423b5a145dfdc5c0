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
	"strings"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/runsc"
)

func requestHash(kind, id string, v any) string {
	b, _ := json.Marshal(v) // plain request structs always marshal
	h := sha256.Sum256(append([]byte(kind+"\x00"+id+"\x00"), b...))
	return hex.EncodeToString(h[:])
}

// beginOp looks up an operation id. If the operation already finished it
// returns its record (done or failed) and started=false. If it is running
// in this process it waits for it. Otherwise it runs create inside the
// same transaction that records the operation as pending.
func (n *Node) beginOp(ctx context.Context, op journal.Operation, create func(*journal.Tx) error) (journal.Operation, bool, error) {
	for {
		n.mu.Lock()
		wait, running := n.inflight[op.ID]
		n.mu.Unlock()
		if running {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return op, false, errdefs.Errorf(errdefs.CodeUnavailable, "operation %q still running: %v", op.ID, ctx.Err())
			}
		}
		var prev journal.Operation
		var found bool
		err := n.d.Journal.Update(func(tx *journal.Tx) error {
			var err error
			if prev, found, err = tx.Operation(op.ID); err != nil || found {
				return err
			}
			if err := create(tx); err != nil {
				return err
			}
			return tx.PutOperation(op)
		})
		if err != nil {
			return op, false, journalErr("journal operation "+op.ID, err)
		}
		if found {
			if prev.RequestHash != op.RequestHash {
				return prev, false, errdefs.Errorf(errdefs.CodeConflict, "operation_id %q was used for a different request", op.ID)
			}
			if prev.State == journal.OpPending {
				// Pending but not running here: a takeover's reconciler
				// resolves these before serving, so this is a bug or a race
				// with reconcile; never run it twice.
				return prev, false, errdefs.Errorf(errdefs.CodeUnavailable, "operation %q is pending recovery", op.ID)
			}
			return prev, false, nil
		}
		n.mu.Lock()
		n.inflight[op.ID] = make(chan struct{})
		n.mu.Unlock()
		return op, true, nil
	}
}

func (n *Node) endOp(id string) {
	n.mu.Lock()
	if ch, ok := n.inflight[id]; ok {
		close(ch)
		delete(n.inflight, id)
	}
	n.mu.Unlock()
}

// opOutcome decodes a finished operation's stored result or error.
func opOutcome[T any](op journal.Operation) (T, error) {
	var out T
	if op.Error != nil {
		return out, &errdefs.Error{Code: op.Error.Code, Message: op.Error.Message}
	}
	if err := json.Unmarshal(op.Result, &out); err != nil {
		return out, errdefs.Errorf(errdefs.CodeInternal, "decode stored result of %s: %v", op.ID, err)
	}
	return out, nil
}

// Claim makes a runtime generation for a sandbox and returns once its
// readiness proof arrived.
func (n *Node) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.ClaimResponse, error) {
	cid := containerID(id, req.Generation)
	// Everything that can be refused is refused here, before the journal:
	// a bad request must never become a record and a rollback.
	if err := names.CheckGeneration(id, req.Generation); err != nil {
		return api.ClaimResponse{}, err
	}
	if err := leaseSpec(cid, resourcesRecord(req.Resources), n.cfg.BootCPUMillis, n.cfg.RuntimePIDs).Validate(); err != nil {
		return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "lease: %v", err)
	}
	pol, err := n.parsePolicy(networkRecord(req.Network))
	if err != nil {
		return api.ClaimResponse{}, err
	}
	if err := n.checkNetwork(pol); err != nil {
		return api.ClaimResponse{}, err
	}
	for _, e := range req.Process.Env {
		if strings.HasPrefix(e, runsc.AgentEnvPrefix) {
			return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "process env %q: %s is reserved for the guest agent", e, runsc.AgentEnvPrefix)
		}
	}
	if err := n.checkVolumes(ctx, req); err != nil {
		return api.ClaimResponse{}, err
	}
	var lower string
	switch req.RootFS.Mode {
	case api.RootFSOverlay:
		req.Resources = n.withDiskDefault(req.Resources)
		if err := n.checkDisk(req.Resources); err != nil {
			return api.ClaimResponse{}, err
		}
		lower = filepath.Join(n.cfg.TemplatesDir, req.RootFS.Template)
		if fi, err := os.Stat(lower); err != nil || !fi.IsDir() {
			return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeNotFound, "template %q not found on this node", req.RootFS.Template)
		}
	case api.RootFSBlock:
		// The disk lease is the device size: no project quota.
		if err := n.checkBlock(ctx, id, &req); err != nil {
			return api.ClaimResponse{}, err
		}
	default:
		return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "rootfs mode %q is not supported", req.RootFS.Mode)
	}
	nonce, err := newNonce()
	if err != nil {
		return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeInternal, "%v", err)
	}
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return api.ClaimResponse{}, err
	}
	defer done()
	reqRec := claimRecord(req)
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
	var waitBound <-chan time.Time // the bound on waiting for a carrier being made
admit:
	for {
		rec = base
		changed := n.warm.changes()
		making := false
		op, started, err = n.beginOp(ctx, op, func(tx *journal.Tx) error {
			// The disk project is allocated in the admitting transaction, so
			// two claims never pick the same one.
			live, err := tx.LiveSandboxes()
			if err != nil {
				return err
			}
			if rootfsMode(rec) == journal.RootFSOverlay {
				if rec.DiskProject, err = n.allocDiskProject(live); err != nil {
					return err
				}
			}
			// The address slot likewise (network.go): a warm carrier's if
			// there is one (carriers.go).
			if err := n.takeCarrier(tx, live, &rec); err != nil {
				making = errors.Is(err, errCarrierMaking)
				return err
			}
			return n.admitClaim(tx, rec)
		})
		if !making {
			break
		}
		// The last free block is a carrier's being made: wait for it
		// (bounded) and take it, rather than refuse the claim.
		if waitBound == nil {
			t := time.NewTimer(n.carrierWait())
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
			return api.ClaimResponse{}, err
		}
		return opOutcome[api.ClaimResponse](op)
	}
	defer n.endOp(op.ID)
	log := n.log.With("sandbox", id, "generation", req.Generation, "op", op.ID)

	resp, cerr := n.runClaim(ctx, rec, lower)
	if cerr == nil {
		log.Info("sandbox ready", "container", cid, "total_ms", resp.Sandbox.Timings.TotalMS)
		n.armExpiry(rec)
		return resp, nil
	}
	if n.live() != nil {
		return api.ClaimResponse{}, n.leftToSuccessor(log, op.ID, cerr)
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
			return api.ClaimResponse{}, n.leftToSuccessor(log, op.ID, errors.Join(cerr, err))
		}
		log.Error("rollback incomplete; capacity withheld", "err", err)
	}
	return api.ClaimResponse{}, n.failOp(op, cerr)
}

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
	all, err := tx.LiveSandboxes()
	if err != nil {
		return err
	}
	// The lease's pids.max, the runtime's allowance with the claim's.
	need := rec.Resources
	need.PIDs += rec.RuntimePIDs
	if ok, why := fits(ledger(n.d.Total, n.cfg.Reserve, all), need); !ok {
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
func (n *Node) failOp(op journal.Operation, cause error) error {
	code := codeOf(cause)
	msg := cause.Error()
	var ae *errdefs.Error
	if errors.As(cause, &ae) {
		msg = ae.Message
	}
	op.State, op.Error = journal.OpFailed, &journal.OpError{Code: code, Message: msg}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutOperation(op) }); err != nil {
		n.log.Error("journal failed operation", "op", op.ID, "err", err)
	}
	return &errdefs.Error{Code: code, Message: msg}
}

// effect journals an effect as intended, makes it, and journals it done.
func (n *Node) effect(kind journal.Kind, name string, rec journal.Sandbox, make func() error) error {
	e := journal.Effect{Kind: kind, Name: name, SandboxID: rec.ID, Generation: rec.Generation, State: journal.Intended, Epoch: n.d.Epoch, Slot: rec.Slot}
	if err := n.live(); err != nil {
		return err
	}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutEffect(e) }); err != nil {
		return fmt.Errorf("journal %s %s intended: %w", kind, name, err)
	}
	n.crash(string(kind) + ":intended")
	if err := n.live(); err != nil {
		return err
	}
	if err := make(); err != nil {
		return err
	}
	n.crash(string(kind) + ":made")
	e.State = journal.Done
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutEffect(e) }); err != nil {
		return fmt.Errorf("journal %s %s done: %w", kind, name, err)
	}
	n.crash(string(kind) + ":done")
	return nil
}

// leaseSpec is a generation's lease: its claim's resources, the boot CPU
// allowance, and pids.max with the runtime's allowance on top.
func leaseSpec(cid string, r journal.Resources, bootCPU, runtimePIDs int64) lease.Spec {
	s := lease.Spec{ID: cid, CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, PIDs: r.PIDs + runtimePIDs, Cpuset: r.Cpuset}
	if bootCPU > r.CPUMillis {
		s.BootCPUMillis = bootCPU
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// claimPhases maps each resource to the claim timing it counts in.
func claimPhases(t *journal.Timings) map[journal.Kind]*float64 {
	return map[journal.Kind]*float64{
		journal.KindLogs: &t.LeaseMS, journal.KindCgroup: &t.LeaseMS,
		journal.KindDisk: &t.RootFSMS, journal.KindMount: &t.RootFSMS,
		journal.KindWriter: &t.RootFSMS, journal.KindBlockMount: &t.RootFSMS, journal.KindVolumes: &t.RootFSMS,
		journal.KindNetns: &t.NetworkMS, journal.KindLinks: &t.NetworkMS, journal.KindConntrack: &t.NetworkMS,
		journal.KindNft: &t.NetworkMS, journal.KindDNS: &t.NetworkMS,
		journal.KindAgent: &t.RunscMS, journal.KindBundle: &t.RunscMS, journal.KindRunsc: &t.RunscMS,
	}
}

func (n *Node) runClaim(ctx context.Context, rec journal.Sandbox, lower string) (api.ClaimResponse, error) {
	cid := rec.ContainerID
	t := journal.Timings{AdmitMS: rec.Timings.AdmitMS}
	phase := claimPhases(&t)
	start := time.Now()

	// Make the generation's resources in table order, each journaled.
	c := &claimState{rec: rec, lower: lower}
	for _, r := range n.tableFor(rec) {
		t0 := time.Now()
		if err := n.effect(r.kind(), cid, c.rec, func() error { return r.make(ctx, c) }); err != nil {
			return api.ClaimResponse{}, err
		}
		d := ms(time.Since(t0))
		t.Steps = append(t.Steps, journal.StepTiming{Resource: string(r.kind()), MakeMS: d})
		if p := phase[r.kind()]; p != nil {
			*p += d
		}
	}
	rec, root := c.rec, c.root
	step := time.Now()

	// Readiness proof: the guest's agent, the init that started the
	// workload, must answer with this generation's nonce.
	nonce, err := n.awaitAgent(ctx, rec)
	if err != nil {
		return api.ClaimResponse{}, err
	}
	// The boot allowance ends before the generation is published: a ready
	// generation always runs at its claim's share. (A takeover rolls back
	// a claim still at its allowance.)
	if spec := leaseSpec(cid, rec.Resources, n.cfg.BootCPUMillis, rec.RuntimePIDs); spec.BootCPUMillis > 0 {
		if err := n.d.Leases.SetCPUMax(ctx, rec.LeaseID, spec.CPUMillis); err != nil {
			return api.ClaimResponse{}, fmt.Errorf("end the boot CPU allowance: %w", err)
		}
	}
	ready, err := n.acceptReadiness(Readiness{SandboxID: rec.ID, Generation: rec.Generation, ContainerID: cid, Nonce: nonce}, func(s *journal.Sandbox) {
		t.ProofMS = ms(time.Since(step))
		t.TotalMS = ms(time.Since(start))
		s.Root, s.Timings = root, t
	})
	if err != nil {
		return api.ClaimResponse{}, err
	}
	return api.ClaimResponse{Sandbox: apiSandbox(ready)}, nil
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
		res, err := json.Marshal(api.ClaimResponse{Sandbox: apiSandbox(s)})
		if err != nil {
			return err
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
