package manager

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// A failed sandbox always says why. Every write that puts a sandbox in
// the failed state takes the reason and records it in the same
// transaction (FailOperation, FailPlacedClaim, a lost node's sweep), and
// the service's end of a create (FailCreate, EndOwnedSandbox) refuses an
// empty one: a caller reading the sandbox between two writes once saw it
// failed with no reason (TestKernelServeReplicaKilledMidCreate).

// failClaimTx fails claim op's generation with reason msg.
func failClaimTx(ctx context.Context, tx *sql.Tx, op OperationRecord, msg, now string) error {
	if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ?, ended_at = ? WHERE sandbox_id = ? AND generation = ?`,
		api.StateFailed, now, op.SandboxID, op.Generation); err != nil {
		return fmt.Errorf("update generation %s/%d: %w", op.SandboxID, op.Generation, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ? WHERE id = ? AND generation = ?`,
		api.StateFailed, msg, op.SandboxID, op.Generation); err != nil {
		return fmt.Errorf("update sandbox %s: %w", op.SandboxID, err)
	}
	return finishOp(ctx, tx, op.OperationID, OpFailed, msg, now)
}

// FailCreate fails a create that can no longer complete, in one
// transaction: the sandbox's pending claim, if the create got that far,
// fails with opErr (what the operator reads with the operation), and the
// owner's sandbox ends with reason (what its caller reads), its share
// back. Both are required.
func (s *Store) FailCreate(ctx context.Context, id, opErr, reason string) error {
	if opErr == "" || reason == "" {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "fail create of %s: no reason given", id)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		ops, err := collect(ctx, tx, scanOperation, operationSelect+` WHERE sandbox_id = ? AND kind = ? AND state = 'pending'`, id, KindClaim)
		if err != nil {
			return fmt.Errorf("fail create of %s: %w", id, err)
		}
		for _, op := range ops {
			if err := failClaimTx(ctx, tx, op, opErr, now); err != nil {
				return fmt.Errorf("fail create of %s: %w", id, err)
			}
		}
		return endOwnedTx(ctx, tx, id, reason, now)
	})
}
