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

// Exits and egress in fleet mode (issue 24): a replica drives no ctld, so
// what the single-node service asks its ctld (has the guest exited? has
// it sent traffic?) it reads from the database, where each node process
// records it: the exits its ctld journaled (RecordPlacedExit) and its
// ctld's metering stream (usage_records, UsagePuller). NodeSandbox's
// fleet view carries both, so the service's exit watch and idle timer run
// the same code in both modes.

// placedExitMigration: the exit a node process saw on its ctld for a
// generation it holds (the exit status, JSON).
const placedExitMigration = `CREATE TABLE placed_exits (
		sandbox_id  TEXT NOT NULL,
		generation  BIGINT NOT NULL,
		node_id     TEXT NOT NULL,
		exit        TEXT NOT NULL,
		recorded_at TEXT NOT NULL,
		PRIMARY KEY (sandbox_id, generation)
	);`

// RecordPlacedExit records that generation gen of sandbox id exited on
// node nodeID (its ctld journaled the exit e), iff the node still holds
// that generation (fenced otherwise: a node that lost the sandbox cannot
// speak for its new generation) and it is ready. The generation's state
// is left to the service's exit watch (RecordExit), which moves it to
// exited together with the owner's exit, as in single-node mode: a
// reader never sees a sandbox exited without how. first is false when
// the exit was recorded before (a repeat after a node process restart)
// or the generation is no longer ready (a release under way).
func (s *Store) RecordPlacedExit(ctx context.Context, nodeID, id string, gen uint64, e SandboxExit) (first bool, err error) {
	b, err := json.Marshal(e)
	if err != nil {
		return false, fmt.Errorf("encode exit of %s: %w", id, err)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		first = false
		if err := holdsTx(ctx, tx, nodeID, id, gen); err != nil {
			return err
		}
		var state api.SandboxState
		err := tx.QueryRowContext(ctx, `SELECT state FROM generations WHERE sandbox_id = ? AND generation = ?`, id, gen).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("sandbox %s has no generation %d", id, gen)
		} else if err != nil {
			return fmt.Errorf("read generation %d of %s: %w", gen, id, err)
		}
		if state != api.StateReady {
			return nil
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO placed_exits (sandbox_id, generation, node_id, exit, recorded_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, id, gen, nodeID, string(b), ts(s.now()))
		if err != nil {
			return fmt.Errorf("insert exit: %w", err)
		}
		n, err := res.RowsAffected()
		first = err == nil && n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("record exit of %s generation %d on %s: %w", id, gen, nodeID, err)
	}
	return first, nil
}

// placedExit is the exit recorded for generation gen of sandbox id (nil:
// none).
func (s *Store) placedExit(ctx context.Context, id string, gen uint64) (*api.ExitStatus, error) {
	var raw string
	err := s.db.QueryRowContext(ctx, `SELECT exit FROM placed_exits WHERE sandbox_id = ? AND generation = ?`, id, gen).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read exit of %s generation %d: %w", id, gen, err)
	}
	var e SandboxExit
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "decode exit of %s generation %d: %v", id, gen, err)
	}
	return &api.ExitStatus{Kind: e.Kind, Code: e.Code, At: e.At}, nil
}

// GenerationEgress sums the egress counters of the usage records node
// nodeID's stream holds for generation gen of sandbox id (each record
// counts its period), and says whether there is any: the generation's
// egress so far, as far as its node's stream has been pulled. Another
// node's records of the sandbox do not count.
func (s *Store) GenerationEgress(ctx context.Context, nodeID, id string, gen uint64) (api.NetworkStatus, bool, error) {
	var n int64
	var v [3]int64
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(tx_bytes), 0), COALESCE(SUM(tx_packets), 0), COALESCE(SUM(dropped_packets), 0)
		FROM usage_records WHERE node_id = ? AND sandbox_id = ? AND generation = ?`, nodeID, id, clampCounter(gen)).Scan(&n, &v[0], &v[1], &v[2])
	if err != nil {
		return api.NetworkStatus{}, false, fmt.Errorf("sum egress of %s generation %d: %w", id, gen, err)
	}
	return api.NetworkStatus{TxBytes: uint64(v[0]), TxPackets: uint64(v[1]), DroppedPackets: uint64(v[2])}, n > 0, nil
}
