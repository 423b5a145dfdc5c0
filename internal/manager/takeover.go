package manager

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// Lost nodes' block sandboxes (issue 24): a block sandbox whose node was
// marked lost keeps its identity and its last committed head (in the
// shared block store, mirrored in the heads table). TakeOverLost places
// its next generation on another node, from that head, in one
// transaction that also fails what was pending of the old generation.
// The generation number is the sandbox's writer epoch in the database:
// only the node holding the current generation's reservation may record
// anything of the sandbox (FinishPlacedClaim, PublishPlacedHead), so the
// old node, if it comes back, can publish nothing over the new one. Its
// generation's reservation stays held on it until its ctld releases that
// generation (ReleaseStale, run by its node process at registration) and
// the proof verifies against its pinned key.

// Takeover is one lost block sandbox resumed elsewhere.
type Takeover struct {
	SandboxID string `json:"sandbox_id"`
	From      string `json:"from_node"`
	FromGen   uint64 `json:"from_generation"`
	Placement
	// Head is the committed head the new generation starts from (Seq 0:
	// the template).
	Head api.VolumeHead `json:"head"`
}

// maxTakeovers bounds one TakeOverLost call; the next sweep goes on.
const maxTakeovers = 100

// TakeOverLost resumes the lost block sandboxes of lost nodes on other
// nodes: each in its own transaction (a sandbox no node has room for
// stays lost, and is tried again at the next call), with the spec of its
// last completed claim and the head recorded for it. newOpID names each
// new claim.
func (s *Store) TakeOverLost(ctx context.Context, newOpID func() (string, error)) ([]Takeover, []error) {
	ids, err := collect(ctx, s.db, func(r rowScanner) (string, error) {
		var id string
		return id, r.Scan(&id)
	}, `SELECT s.id FROM sandboxes s JOIN nodes n ON n.node_id = s.node_id WHERE s.state = ? AND n.state = 'lost' ORDER BY s.id LIMIT ?`,
		api.StateLost, maxTakeovers)
	if err != nil {
		return nil, []error{fmt.Errorf("list lost sandboxes: %w", err)}
	}
	var out []Takeover
	var errs []error
	for _, id := range ids {
		opID, err := newOpID()
		if err != nil {
			return out, append(errs, err)
		}
		t, err := s.takeOver(ctx, id, opID)
		if err != nil {
			errs = append(errs, fmt.Errorf("take over %s: %w", id, err))
			continue
		}
		if t.SandboxID != "" {
			out = append(out, t)
		}
	}
	for _, t := range out {
		_ = s.NotifyNode(ctx, t.NodeID)
	}
	return out, errs
}

func (s *Store) takeOver(ctx context.Context, id, opID string) (Takeover, error) {
	var out Takeover
	err := s.tx(ctx, func(tx *sql.Tx) error {
		out = Takeover{}
		sb, err := sandboxTx(ctx, tx, id)
		if err != nil {
			return err
		}
		from, err := fleetNodeTx(ctx, tx, sb.NodeID)
		if err != nil {
			return err
		}
		if sb.State != api.StateLost || from.State != NodeLost {
			return nil // taken over by another process meanwhile
		}
		spec, err := lastClaimSpec(ctx, tx, id)
		if err != nil {
			return err
		}
		var h api.VolumeHead
		err = tx.QueryRowContext(ctx, `SELECT seq, generation, writer_epoch, node_id FROM heads WHERE sandbox_id = ?`, id).
			Scan(&h.Seq, &h.Generation, &h.WriterEpoch, &h.Node)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read head of %s: %w", id, err)
		}
		spec.RootFS.ExpectHead = api.VolumeHead{Seq: h.Seq, Generation: h.Generation}
		request, err := json.Marshal(spec)
		if err != nil {
			return fmt.Errorf("encode the claim of %s: %w", id, err)
		}
		reason := fmt.Sprintf("generation %d on node %s lost (%s); resumed from head %d", sb.Generation, from.NodeID, from.Reason, h.Seq)
		now := ts(s.now())
		// What was pending of the lost generation will never be answered
		// by its node for this sandbox (a late answer is refused).
		if _, err := tx.ExecContext(ctx, `UPDATE operations SET state = 'failed', error = ?, finished_at = ? WHERE sandbox_id = ? AND state = 'pending'`,
			from.Reason, now, id); err != nil {
			return fmt.Errorf("fail operations of %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET ended_at = ? WHERE sandbox_id = ? AND generation = ?`, now, id, sb.Generation); err != nil {
			return fmt.Errorf("end generation %s/%d: %w", id, sb.Generation, err)
		}
		pl, err := s.placeTx(ctx, tx, PlaceIntent{SandboxID: id, OperationID: opID, Spec: spec}, request, sb, reason)
		if err != nil {
			return err
		}
		// The new writer epoch: the head's compare-and-swap now refuses
		// whatever the old generation would publish, whatever its seq.
		// The row is written even for a sandbox that never published
		// (seq 0: the template): raising only an existing row left such a
		// sandbox's old writer unfenced by the CAS (test/model found it;
		// holdsTx alone refused it).
		if _, err := tx.ExecContext(ctx, `INSERT INTO heads (sandbox_id, seq, generation, writer_epoch, node_id, updated_at) VALUES (?, 0, 0, ?, '', ?)
			ON CONFLICT (sandbox_id) DO UPDATE SET writer_epoch = excluded.writer_epoch WHERE heads.writer_epoch < excluded.writer_epoch`,
			id, pl.Operation.Generation, now); err != nil {
			return fmt.Errorf("raise the writer epoch of %s: %w", id, err)
		}
		out = Takeover{SandboxID: id, From: from.NodeID, FromGen: sb.Generation, Placement: pl, Head: h}
		return nil
	})
	return out, err
}

// lastClaimSpec is the spec of sandbox id's last completed claim.
func lastClaimSpec(ctx context.Context, tx *sql.Tx, id string) (Spec, error) {
	op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE sandbox_id = ? AND kind = 'claim' AND state = 'done' ORDER BY generation DESC LIMIT 1`, id))
	if err != nil {
		return Spec{}, fmt.Errorf("the last claim of %s: %w", id, err)
	}
	var spec Spec
	if err := json.Unmarshal(op.Request, &spec); err != nil {
		return Spec{}, fmt.Errorf("decode the last claim of %s (%s): %w", id, op.OperationID, err)
	}
	return spec, nil
}

// StaleGeneration is a generation a node still holds a reservation for
// while the database gives the sandbox to another generation (taken over
// elsewhere).
type StaleGeneration struct {
	SandboxID  string `json:"sandbox_id"`
	Generation uint64 `json:"generation"`
	// Operation is the release recorded for it (new or already pending).
	Operation OperationRecord `json:"operation"`
}

// ReleaseStale records a release of every generation node nodeID still
// holds a reservation for but the database no longer gives it (the
// sandbox moved on to a newer generation), unless one is pending. The
// node's process carries them out (NodeWork lists them for this node);
// each verified clean proof returns the reservation.
func (s *Store) ReleaseStale(ctx context.Context, nodeID string, newOpID func() (string, error)) ([]StaleGeneration, error) {
	var out []StaleGeneration
	err := s.tx(ctx, func(tx *sql.Tx) error {
		out = nil
		stale, err := collect(ctx, tx, func(r rowScanner) (StaleGeneration, error) {
			var g StaleGeneration
			return g, r.Scan(&g.SandboxID, &g.Generation)
		}, `SELECT r.sandbox_id, r.generation FROM reservations r JOIN sandboxes s ON s.id = r.sandbox_id
			WHERE r.node_id = ? AND r.released_at IS NULL AND (s.generation <> r.generation OR s.node_id <> r.node_id)
			ORDER BY r.sandbox_id, r.generation LIMIT ?`, nodeID, maxNodeWork)
		if err != nil {
			return fmt.Errorf("list the stale generations of node %s: %w", nodeID, err)
		}
		now := ts(s.now())
		for _, g := range stale {
			op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE sandbox_id = ? AND generation = ? AND kind = 'release' AND state = 'pending'`,
				g.SandboxID, g.Generation))
			if errdefs.CodeOf(err) == errdefs.CodeNotFound {
				opID, ierr := newOpID()
				if ierr != nil {
					return ierr
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, created_at) VALUES (?, 'release', ?, ?, 'pending', ?)`,
					opID, g.SandboxID, g.Generation, now); err != nil {
					return fmt.Errorf("record the release of %s/%d: %w", g.SandboxID, g.Generation, err)
				}
				op, err = scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
			}
			if err != nil {
				return err
			}
			g.Operation = op
			out = append(out, g)
		}
		return nil
	})
	return out, err
}

// holdsTx refuses (fenced) unless node nodeID holds the reservation of
// sandbox id's current generation gen: what a node may record of a
// sandbox.
func holdsTx(ctx context.Context, tx *sql.Tx, nodeID, id string, gen uint64) error {
	sb, err := sandboxTx(ctx, tx, id)
	if err != nil {
		return err
	}
	if sb.NodeID != nodeID || sb.Generation != gen || sb.State == api.StateLost {
		return errdefs.Errorf(errdefs.CodeFenced, "sandbox %s generation %d on node %s: the database gives the sandbox to generation %d on node %s (%s)",
			id, gen, nodeID, sb.Generation, sb.NodeID, sb.State)
	}
	return nil
}

// FinishPlacedClaim records node nodeID's answer to a placed claim, iff
// the claim is still pending and the node still holds its generation: a
// late answer from a node that was lost is refused (fenced) and changes
// nothing; its node process then releases what its ctld made
// (ReleaseStale).
func (s *Store) FinishPlacedClaim(ctx context.Context, nodeID, opID string, sb api.Sandbox) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("finish claim %s: %w", opID, err)
		}
		if op.Kind != KindClaim || op.State != OpPending {
			return errdefs.Errorf(errdefs.CodeFenced, "finish claim %s: it is a %s %s (%s)", opID, op.State, op.Kind, op.Error)
		}
		if err := holdsTx(ctx, tx, nodeID, op.SandboxID, op.Generation); err != nil {
			return err
		}
		return s.finishClaimTx(ctx, tx, opID, sb)
	})
	return err
}

// PublishPlacedHead records a head node nodeID published for sandbox id's
// generation gen (PublishHead's compare-and-swap), iff the node still
// holds that generation: a node that lost the sandbox to a takeover
// cannot move its head. In the fleet the head's writer epoch is the
// generation that wrote it, here and in the shared block store (the
// claim carries it: ClaimRequestOf; nodes' own writer epochs do not
// compare across nodes); a takeover raises it (takeOver), and the new
// generation's claim raises the store's head to it before its writer
// starts (internal/node/blockroot fence.go).
func (s *Store) PublishPlacedHead(ctx context.Context, nodeID, id string, gen uint64, h api.VolumeHead) error {
	h.WriterEpoch = gen
	return s.tx(ctx, func(tx *sql.Tx) error {
		if err := holdsTx(ctx, tx, nodeID, id, gen); err != nil {
			return err
		}
		return s.publishHeadTx(ctx, tx, id, h)
	})
}
