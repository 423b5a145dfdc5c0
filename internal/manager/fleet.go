package manager

import (
	"context"
	"database/sql"
	"encoding/json"
	"net"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// Fleet mode (issue 24): a Manager whose Fleet is set drives no ctld of
// its own. A create is placed (Store.Place: the node chosen and its
// capacity reserved in the claim's transaction) and carried out by the
// chosen node's process (nodeagent), which records ctld's answer; a
// destroy is recorded (Store.RequestRelease) and carried out the same
// way, its proof judged against the node's pinned key in the transaction
// that returns the capacity (Store.FinishPlacedRelease). The Manager only
// waits for the recorded outcome, so any replica can wait for any
// operation and a replica's death loses nothing the database holds.
// Streams (exec, files, logs) go to the node process's channel (Dial).

// Fleet configures a Manager's fleet mode.
type Fleet struct {
	// Poll is the longest wait between two reads of a placed operation's
	// outcome (default 100ms; the first reads come sooner).
	Poll time.Duration
	// Dial connects to node's stream channel (an authenticated
	// connection: nodechannel.Dialer); nil: streams to placed sandboxes
	// are unavailable.
	Dial func(ctx context.Context, node FleetNode) (net.Conn, error)
}

func (f *Fleet) poll() time.Duration {
	if f.Poll > 0 {
		return f.Poll
	}
	return 100 * time.Millisecond
}

// InFleet reports whether m places its sandboxes on a fleet's nodes.
func (m *Manager) InFleet() bool { return m.Fleet != nil }

// createPlaced places a validated create and waits for its node's answer.
func (m *Manager) createPlaced(ctx context.Context, id, opID string, spec Spec) (CreateResult, error) {
	pl, err := m.Store.Place(ctx, PlaceIntent{SandboxID: id, OperationID: opID, Spec: spec})
	if err != nil {
		return CreateResult{}, err
	}
	res := CreateResult{OperationID: pl.Operation.OperationID, Reused: pl.Reused}
	log := m.log().With("sandbox", id, "generation", pl.Operation.Generation, "operation", pl.Operation.OperationID, "node", pl.NodeID)
	log.Info("claim placed", "reused", pl.Reused)
	op, err := m.waitPlaced(ctx, pl.Operation.OperationID)
	if err != nil {
		log.Warn("placed claim's outcome not known yet; its node carries it out", "err", err)
		return res, err
	}
	if op.State == OpFailed {
		err := placedError(op.Error)
		log.Warn("placed claim failed", "err", err)
		return res, err
	}
	if res.Sandbox, err = m.placedSandbox(ctx, id, op.Generation); err != nil {
		return res, err
	}
	if err := m.raiseVolumeMarks(context.WithoutCancel(ctx), res.Sandbox); err != nil {
		return res, err
	}
	log.Info("sandbox ready", "container", res.Sandbox.ContainerID)
	return res, nil
}

// destroyPlaced records the release of a placed sandbox, waits for its
// node's answer and judges the stored proof.
func (m *Manager) destroyPlaced(ctx context.Context, id string) (DestroyResult, error) {
	sb, err := m.Store.Sandbox(ctx, id)
	if err != nil {
		return DestroyResult{}, err
	}
	res, op, done, err := m.beginDestroy(ctx, sb, m.Store.RequestRelease)
	if done || err != nil {
		return res, err
	}
	if op, err = m.waitPlaced(ctx, op.OperationID); err != nil {
		return res, err
	}
	if op.State == OpFailed {
		// The node may have released the generation itself: its
		// process recorded that release (FinishPlacedNodeRelease).
		if now, serr := m.Store.Sandbox(ctx, id); serr == nil && now.State == api.StateReleased && now.Generation == op.Generation {
			return m.released(ctx, now)
		}
		return res, placedError(op.Error)
	}
	if res.Verdict, err = m.VerifyProof(context.WithoutCancel(ctx), op.OperationID); err != nil {
		return res, err
	}
	res.Sandbox, err = m.placedSandbox(ctx, id, op.Generation)
	m.log().Info("sandbox released", "sandbox", id, "generation", op.Generation, "operation", op.OperationID, "node", sb.NodeID,
		"proof_verified", res.Verdict.Verified, "proof_clean", res.Verdict.Clean, "reason", res.Verdict.Reason)
	return res, err
}

// waitPlaced waits until operation opID is no longer pending: its node
// process recorded the answer. The wait grows from 5ms to Fleet.Poll. A
// ctx that ends first is an unknown outcome (unavailable): the operation
// stays pending and its node carries it out.
func (m *Manager) waitPlaced(ctx context.Context, opID string) (OperationRecord, error) {
	wait := 5 * time.Millisecond
	for {
		op, err := m.Store.Operation(ctx, opID)
		if err != nil {
			return op, err
		}
		if op.State != OpPending {
			return op, nil
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return op, errdefs.Errorf(errdefs.CodeUnavailable, "operation %s is placed and not answered yet (%v); its node carries it out", opID, err)
		}
		wait = min(2*wait, m.Fleet.poll())
	}
}

// placedSandbox is generation gen of sandbox id as the database has it.
func (m *Manager) placedSandbox(ctx context.Context, id string, gen uint64) (api.Sandbox, error) {
	sb, err := m.Store.Sandbox(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	gens, err := m.Store.Generations(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	out := api.Sandbox{ID: id, Generation: gen, State: sb.State, CreatedAt: sb.CreatedAt}
	for _, g := range gens {
		if g.Generation == gen {
			out.State, out.ContainerID, out.LeaseID = g.State, g.ContainerID, g.LeaseID
			out.Resources, out.RootFS, out.Timings = g.Resources, g.RootFS, g.Timings
			if err := m.placedFacts(ctx, &out, sb.NodeID, g.Network.Mode); err != nil {
				return api.Sandbox{}, err
			}
		}
	}
	return out, nil
}

// placedFacts adds what the node process recorded of a generation beyond
// its operations (fleet_exits.go): its exit, and its egress as far as its
// node's (nodeID's) metering stream was pulled (nil network: no record).
func (m *Manager) placedFacts(ctx context.Context, sb *api.Sandbox, nodeID string, mode api.NetworkMode) error {
	var err error
	if sb.State == api.StateReady || sb.State == api.StateExited {
		if sb.Exit, err = m.Store.placedExit(ctx, sb.ID, sb.Generation); err != nil {
			return err
		}
		if sb.Exit != nil {
			sb.State = api.StateExited
		}
	}
	ns, ok, err := m.Store.GenerationEgress(ctx, nodeID, sb.ID, sb.Generation)
	if err != nil {
		return err
	}
	if ok {
		ns.Mode = mode
		sb.Network = &ns
	}
	return nil
}

// placedError turns the error a node process recorded for an operation
// ("code: message", as errdefs prints it) back into its kind.
func placedError(msg string) error {
	code, rest, ok := strings.Cut(msg, ": ")
	switch c := errdefs.Code(code); c {
	case errdefs.CodeInvalidArgument, errdefs.CodeNotFound, errdefs.CodeConflict, errdefs.CodeCapacityExhausted,
		errdefs.CodeFenced, errdefs.CodePermissionDenied, errdefs.CodeInternal:
		if ok {
			return errdefs.Errorf(c, "%s", rest)
		}
	}
	return errdefs.Errorf(errdefs.CodeInternal, "%s", msg)
}

// client is the ctld client that reaches sandbox id: the local ctld, or
// in fleet mode its node's stream channel.
func (m *Manager) client(ctx context.Context, id string) (*api.Client, error) {
	if m.Fleet == nil {
		return m.Client, nil
	}
	sb, err := m.Store.Sandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.NodeID == "" {
		return nil, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s is on no node", id)
	}
	n, err := m.Store.FleetNode(ctx, sb.NodeID)
	if err != nil {
		return nil, err
	}
	switch {
	case m.Fleet.Dial == nil:
		return nil, errdefs.Errorf(errdefs.CodeUnavailable, "sandbox %s runs on node %s and this manager has no stream channel configured (--cluster-ca)", id, n.NodeID)
	case n.Channel == "":
		return nil, errdefs.Errorf(errdefs.CodeUnavailable, "sandbox %s runs on node %s, which offers no stream channel", id, n.NodeID)
	case n.State == NodeLost:
		return nil, errdefs.Errorf(errdefs.CodeUnavailable, "sandbox %s runs on node %s, which is lost: %s", id, n.NodeID, n.Reason)
	}
	dial := m.Fleet.Dial
	return &api.Client{Dial: func(ctx context.Context) (net.Conn, error) {
		c, err := dial(ctx, n)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.CodeUnavailable, "reach node %s at %s: %v", n.NodeID, n.Channel, err)
		}
		return c, nil
	}}, nil
}

// NodeSandbox is sandbox id as its node has it: the local ctld's answer,
// or in fleet mode the database's (its node process records every
// answer; a placed claim not answered yet is claiming).
func (m *Manager) NodeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	if m.Fleet == nil {
		return m.Client.Get(ctx, id)
	}
	sb, err := m.Store.Sandbox(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.placedSandbox(ctx, id, sb.Generation)
}

// notPlaced refuses, in fleet mode, a call the node process does not
// carry out yet (pause, snapshots, forks: they stay single-node).
func (m *Manager) notPlaced(what string) error {
	if m.Fleet == nil {
		return nil
	}
	return errdefs.Errorf(errdefs.CodeUnavailable, "%s is not available in fleet mode yet", what)
}

// pauseRequest marks a placed release as a pause: the node process seals
// the generation's root as the sandbox's head (ctld's pause) and records
// the head (PublishPlacedHead) before the release.
const pauseRequest = `{"pause":true}`

// IsPause reports whether a placed release operation is a pause.
func IsPause(op OperationRecord) bool {
	var r struct {
		Pause bool `json:"pause"`
	}
	return op.Kind == KindRelease && len(op.Request) > 0 && json.Unmarshal(op.Request, &r) == nil && r.Pause
}

// RequestPause records the pause of a placed sandbox (a release that
// seals its root first) and wakes its node's process.
func (s *Store) RequestPause(ctx context.Context, id, newOpID string) (OperationRecord, bool, error) {
	var op OperationRecord
	var reused bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		op, reused, err = s.beginReleaseTx(ctx, tx, id, newOpID, pauseRequest)
		if err == nil && reused && !IsPause(op) {
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s is being destroyed (operation %s)", id, op.OperationID)
		}
		return err
	})
	if err != nil {
		return op, reused, err
	}
	if sb, err := s.Sandbox(ctx, id); err == nil {
		_ = s.NotifyNode(ctx, sb.NodeID)
	}
	return op, reused, nil
}

// pausePlaced records the pause of a placed block sandbox, waits for its
// node's answer, and returns the proof's verdict and the head recorded.
func (m *Manager) pausePlaced(ctx context.Context, id string) (PauseResult, error) {
	opID, err := m.newOpID()
	if err != nil {
		return PauseResult{}, err
	}
	op, reused, err := m.Store.RequestPause(ctx, id, opID)
	if err != nil {
		return PauseResult{}, err
	}
	res := PauseResult{DestroyResult: DestroyResult{OperationID: op.OperationID, Reused: reused}}
	if op, err = m.waitPlaced(ctx, op.OperationID); err != nil {
		return res, err
	}
	if op.State == OpFailed {
		return res, placedError(op.Error)
	}
	if res.Verdict, err = m.VerifyProof(context.WithoutCancel(ctx), op.OperationID); err != nil {
		return res, err
	}
	if res.Sandbox, err = m.placedSandbox(ctx, id, op.Generation); err != nil {
		return res, err
	}
	res.Head, err = m.Store.Head(ctx, id)
	return res, err
}
