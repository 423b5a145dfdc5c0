package nodeagent

import (
	"context"
	"fmt"

	"github.com/ctld/ctld/internal/manager"
)

// A release (or pause) ctld refuses as a conflict may find the generation
// already released by ctld itself (on_exit release, max lifetime): the
// database still says ready. The node process then records ctld's own
// release with the proof ctld stored (the sandbox's ProofOperationID),
// judged in the recording transaction against the node's pinned key
// (Store.FinishPlacedNodeRelease): only a verified clean proof returns the
// reservation. See internal/manager/noderelease.go.

// recordNodeRelease, after ctld refused op as a conflict, looks op's
// generation up on ctld; if ctld released it itself under another
// operation id, it records that release with its proof (done). Not done
// and no error: the refusal stands. An error: nothing is known yet, op
// stays pending for the next step.
func (a *Agent) recordNodeRelease(ctx context.Context, op manager.OperationRecord) (bool, error) {
	got, err := a.Client.Get(ctx, op.SandboxID)
	if err != nil {
		return false, fmt.Errorf("release %s of %s refused; look the sandbox up (left pending): %w", op.OperationID, op.SandboxID, err)
	}
	nodeOpID, ok := manager.NodeReleaseOf(op, got)
	if !ok {
		return false, nil
	}
	p, err := a.Client.Proof(ctx, nodeOpID)
	if err != nil {
		return false, fmt.Errorf("release %s of %s (left pending): fetch the proof %s of the node's own release: %w", op.OperationID, op.SandboxID, nodeOpID, err)
	}
	rec, err := a.Store.FinishPlacedNodeRelease(ctx, op.OperationID, nodeOpID, got, p)
	if err != nil {
		return false, fmt.Errorf("record the node's own release %s of %s: %w", nodeOpID, op.SandboxID, err)
	}
	log := a.log().With("sandbox", op.SandboxID, "generation", op.Generation, "operation", op.OperationID, "node_operation", nodeOpID)
	if rec.VerifyError != "" {
		log.Warn("the node released the sandbox itself; its proof not accepted, capacity stays reserved", "reason", rec.VerifyError)
	} else {
		log.Info("the node released the sandbox itself; recorded with its proof")
	}
	return true, nil
}
