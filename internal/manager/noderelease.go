package manager

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// A release ctld makes itself (on_exit release, the max-lifetime expiry)
// carries ctld's own operation id and the manager never sent it: the
// database still says ready and the manager's later release is refused
// (conflict: already released). That refusal is not a failure of the
// sandbox's end but news of it, so the refused release looks the
// generation up on the node (GET: released, with the operation id of the
// proof ctld stored) and records the node's release with that proof,
// judged like any other: about this sandbox, generation and node, signed
// by the node's trusted key. Only a verified clean proof gives the
// capacity (and, in fleet mode, the reservation) back. The manager's
// release is recorded failed, naming the node's operation, which is
// recorded done beside it; an operation id is never reused for another.

// NodeReleaseOf says whether got, the node's view of op's sandbox after
// it refused op as a conflict, is op's generation released by the node
// itself under another operation id, and returns that id.
func NodeReleaseOf(op OperationRecord, got api.Sandbox) (string, bool) {
	if got.ID != op.SandboxID || got.Generation != op.Generation || got.State != api.StateReleased {
		return "", false
	}
	if got.ProofOperationID == "" || got.ProofOperationID == op.OperationID {
		return "", false
	}
	return got.ProofOperationID, api.ValidateOperationID(got.ProofOperationID) == nil
}

// supersededMsg is the error recorded on the manager's release when the
// node had made the release itself; its "conflict: " prefix is the code a
// fleet waiter answers with (placedError): a pause waiting on it did not
// happen, while a destroy finds the sandbox released.
func supersededMsg(nodeOpID string) string {
	return "conflict: the node released the generation itself (operation " + nodeOpID + ")"
}

// recordNodeReleaseTx records in tx that the node released op's
// generation itself under nodeOpID with proof pr (its verdict already
// set): op fails naming it, nodeOpID is recorded done with the proof, and
// the generation and sandbox take sb's state (released). It returns the
// node's operation as recorded.
func (s *Store) recordNodeReleaseTx(ctx context.Context, tx *sql.Tx, op OperationRecord, nodeOpID string, sb api.Sandbox, pr ProofRecord, now string) (OperationRecord, error) {
	if op.Kind != KindRelease || op.State != OpPending {
		return OperationRecord{}, errdefs.Errorf(errdefs.CodeConflict, "record the node's release of %s/%d: operation %s is a %s %s", op.SandboxID, op.Generation, op.OperationID, op.State, op.Kind)
	}
	state := sb.State
	if state == "" {
		state = api.StateReleased
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, request, created_at, finished_at) VALUES (?, 'release', ?, ?, 'done', '{}', ?, ?) ON CONFLICT (operation_id) DO NOTHING`,
		nodeOpID, op.SandboxID, op.Generation, now, now); err != nil {
		return OperationRecord{}, fmt.Errorf("record the node's release %s: %w", nodeOpID, err)
	}
	nodeOp, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, nodeOpID))
	if err != nil {
		return OperationRecord{}, fmt.Errorf("record the node's release %s: %w", nodeOpID, err)
	}
	if nodeOp.Kind != KindRelease || nodeOp.SandboxID != op.SandboxID || nodeOp.Generation != op.Generation {
		return OperationRecord{}, errdefs.Errorf(errdefs.CodeConflict, "record the node's release %s: the id is recorded for a %s of %s/%d", nodeOpID, nodeOp.Kind, nodeOp.SandboxID, nodeOp.Generation)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ?, ended_at = ? WHERE sandbox_id = ? AND generation = ?`,
		state, now, op.SandboxID, op.Generation); err != nil {
		return OperationRecord{}, fmt.Errorf("update generation %s/%d: %w", op.SandboxID, op.Generation, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ? WHERE id = ? AND generation = ?`, state, op.SandboxID, op.Generation); err != nil {
		return OperationRecord{}, fmt.Errorf("update sandbox %s: %w", op.SandboxID, err)
	}
	if err := finishOp(ctx, tx, op.OperationID, OpFailed, supersededMsg(nodeOpID), now); err != nil {
		return OperationRecord{}, err
	}
	pr.OperationID, pr.SandboxID, pr.Generation = nodeOpID, op.SandboxID, op.Generation
	return nodeOp, saveProof(ctx, tx, pr)
}

// RecordNodeRelease records that the node released the generation of
// pending release opID itself under nodeOpID, with proof pr judged by the
// caller (Manager.judge) against nodeOpID. Single-node mode.
func (s *Store) RecordNodeRelease(ctx context.Context, opID, nodeOpID string, sb api.Sandbox, pr ProofRecord) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("record the node's release for %s: %w", opID, err)
		}
		_, err = s.recordNodeReleaseTx(ctx, tx, op, nodeOpID, sb, pr, ts(s.now()))
		return err
	})
}

// FinishPlacedNodeRelease is FinishPlacedRelease for a placed release the
// node refused because it had released the generation itself under
// nodeOpID: proof p is judged in the transaction against nodeOpID, the
// sandbox, generation and the node's pinned key, and only a verified
// clean one returns the reservation.
func (s *Store) FinishPlacedNodeRelease(ctx context.Context, opID, nodeOpID string, sb api.Sandbox, p api.CleanupProof) (ProofRecord, error) {
	var out ProofRecord
	err := s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("finish release %s: %w", opID, err)
		}
		res, err := scanReservation(tx.QueryRowContext(ctx, reservationSelect+` WHERE sandbox_id = ? AND generation = ?`, op.SandboxID, op.Generation))
		if err != nil {
			return fmt.Errorf("finish release %s of %s/%d: %w", opID, op.SandboxID, op.Generation, err)
		}
		node, err := scanNode(tx.QueryRowContext(ctx, nodeSelect+` WHERE node_id = ?`, res.NodeID))
		if err != nil {
			return fmt.Errorf("finish release %s: node %s: %w", opID, res.NodeID, err)
		}
		now := s.now()
		judged := op
		judged.OperationID = nodeOpID
		out = ProofRecord{Proof: p, VerifyError: judgeProof(p, judged, node, now)}
		out.Verified = out.VerifyError == "" || strings.HasPrefix(out.VerifyError, notCleanPrefix)
		at := ts(now)
		nodeOp, err := s.recordNodeReleaseTx(ctx, tx, op, nodeOpID, sb, out, at)
		if err != nil {
			return err
		}
		out.OperationID, out.SandboxID, out.Generation = nodeOpID, op.SandboxID, op.Generation
		if out.VerifyError == "" {
			return returnReservation(ctx, tx, nodeOp, at)
		}
		return nil
	})
	return out, err
}

// nodeRelease, after the node refused release op of sb as a conflict,
// looks the generation up on the node; if the node released it itself,
// it judges and records that release and returns it (ok). Otherwise ok is
// false and the refusal stands.
func (m *Manager) nodeRelease(ctx context.Context, sb SandboxRecord, op OperationRecord) (api.Sandbox, Verdict, bool, error) {
	got, err := m.Client.Get(ctx, sb.ID)
	if err != nil {
		return api.Sandbox{}, Verdict{}, false, fmt.Errorf("look up sandbox %s on node after a refused release: %w", sb.ID, err)
	}
	nodeOpID, ok := NodeReleaseOf(op, got)
	if !ok {
		return got, Verdict{}, false, nil
	}
	p, err := m.Client.Proof(ctx, nodeOpID)
	if err != nil {
		return got, Verdict{}, false, fmt.Errorf("fetch proof %s from node: %w", nodeOpID, err)
	}
	ctx = context.WithoutCancel(ctx)
	v, err := m.judge(ctx, want{opID: nodeOpID, sandboxID: sb.ID, generation: op.Generation, nodeID: sb.NodeID}, p)
	if err != nil {
		return got, v, false, err
	}
	v.Source = "node"
	if err := m.Store.RecordNodeRelease(ctx, op.OperationID, nodeOpID, got, ProofRecord{Proof: p, Verified: v.Verified, VerifyError: v.Reason}); err != nil {
		return got, v, false, err
	}
	if err := m.raiseVolumeMarks(ctx, got); err != nil {
		return got, v, true, err
	}
	m.log().Info("sandbox was released by the node itself", "sandbox", sb.ID, "generation", op.Generation, "operation", op.OperationID,
		"node_operation", nodeOpID, "proof_verified", v.Verified, "proof_clean", v.Clean, "reason", v.Reason)
	return got, v, true, nil
}
