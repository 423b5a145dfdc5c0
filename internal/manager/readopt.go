package manager

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// A node marked lost may come back (registers again) before its block
// sandboxes were taken over: TakeOverLost moves only the sandboxes of lost
// nodes (no room elsewhere, or no sweep yet), so such a sandbox stayed
// lost for good while its generation ran on, refused by holdsTx (the model
// in test/model found it). The node's process asks its ctld about each
// (LostOn) and gives back each generation ctld still runs (ReadoptLost);
// one ctld no longer runs stays lost.

// LostOn returns the lost sandboxes whose current generation is placed on
// node nodeID (at most maxNodeWork).
func (s *Store) LostOn(ctx context.Context, nodeID string) ([]SandboxRecord, error) {
	out, err := collect(ctx, s.db, scanSandbox, sandboxSelect+` WHERE node_id = ? AND state = ? ORDER BY id LIMIT ?`,
		nodeID, api.StateLost, maxNodeWork)
	if err != nil {
		return nil, fmt.Errorf("list the lost sandboxes of node %s: %w", nodeID, err)
	}
	return out, nil
}

// ReadoptLost gives lost sandbox id back its generation gen, which node
// nodeID's ctld still runs: iff the node is registered and not lost and
// the database still places that generation there (not taken over). The
// sandbox takes the state its pending operation implies (releasing,
// claiming) or ready. Anything else is fenced and changes nothing.
func (s *Store) ReadoptLost(ctx context.Context, nodeID, id string, gen uint64) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		n, err := fleetNodeTx(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		sb, err := sandboxTx(ctx, tx, id)
		if err != nil {
			return err
		}
		if n.State == NodeLost || sb.State != api.StateLost || sb.NodeID != nodeID || sb.Generation != gen {
			return errdefs.Errorf(errdefs.CodeFenced, "readopt %s/%d on node %s (%s): the database has generation %d on node %s (%s)",
				id, gen, nodeID, n.State, sb.Generation, sb.NodeID, sb.State)
		}
		state, gstate := api.StateReady, api.StateReady
		if _, ok, err := pendingOp(ctx, tx, id, KindRelease); err != nil {
			return err
		} else if ok {
			state = api.StateReleasing
		} else if _, ok, err := pendingOp(ctx, tx, id, KindClaim); err != nil {
			return err
		} else if ok {
			state, gstate = api.StateClaiming, api.StateClaiming
		}
		reason := fmt.Sprintf("node %s came back; generation %d still runs there", nodeID, gen)
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ? WHERE id = ? AND generation = ?`, state, reason, id, gen); err != nil {
			return fmt.Errorf("readopt %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ? WHERE sandbox_id = ? AND generation = ?`, gstate, id, gen); err != nil {
			return fmt.Errorf("readopt %s/%d: %w", id, gen, err)
		}
		return nil
	})
}
