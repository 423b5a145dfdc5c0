package manager

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// exitMigration: the service's record of how a sandbox's workload ended
// (the node's exit status, JSON; ” while it runs), issue 23's on_exit.
const exitMigration = `ALTER TABLE owned_sandboxes ADD COLUMN exit TEXT NOT NULL DEFAULT '';`

// ExitStore is the service store's part for on_exit.
type ExitStore interface {
	ExitCandidates(ctx context.Context, limit int) ([]OwnedSandbox, error)
	RecordExit(ctx context.Context, id string, gen uint64, e SandboxExit) (first bool, err error)
}

// SandboxExit is how a sandbox's workload ended, as its node journaled it.
type SandboxExit struct {
	Kind string    `json:"kind"`
	Code int       `json:"code"`
	At   time.Time `json:"at"`
}

// ExitCandidates returns up to limit active sandboxes whose generation the
// manager has ready (the service asks their node whether they exited), or
// exited (recorded; the service destroys it if on_exit destroy asked).
func (s *Store) ExitCandidates(ctx context.Context, limit int) ([]OwnedSandbox, error) {
	out, err := collect(ctx, s.db, scanOwned, ownedSelect+` WHERE o.active = 1 AND o.paused = 0 AND s.state IN (?, ?) ORDER BY o.id LIMIT ?`,
		api.StateReady, api.StateExited, limit)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes to watch for exits: %w", err)
	}
	return out, nil
}

// RecordExit records, once, that generation gen of sandbox id exited on
// its node: the exit on the owner's sandbox and state exited on the
// generation, in one transaction. first is false when it was recorded
// before (another replica, an earlier tick), so the exited event is sent
// once.
func (s *Store) RecordExit(ctx context.Context, id string, gen uint64, e SandboxExit) (first bool, err error) {
	b, err := json.Marshal(e)
	if err != nil {
		return false, fmt.Errorf("encode exit of %s: %w", id, err)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET exit = ? WHERE id = ? AND exit = ''`, string(b), id)
		if err != nil {
			return fmt.Errorf("record exit of %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("record exit of %s: %w", id, err)
		}
		first = n == 1
		for _, q := range []string{
			`UPDATE sandboxes SET state = ? WHERE id = ? AND generation = ? AND state = ?`,
			`UPDATE generations SET state = ? WHERE sandbox_id = ? AND generation = ? AND state = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, api.StateExited, id, gen, api.StateReady); err != nil {
				return fmt.Errorf("record exit of %s: %w", id, err)
			}
		}
		return nil
	})
	return first, err
}

// exitOf decodes an owned sandbox's exit column (”: none).
func exitOf(raw string) (*SandboxExit, error) {
	if raw == "" {
		return nil, nil
	}
	var e SandboxExit
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return nil, fmt.Errorf("decode exit: %w", err)
	}
	return &e, nil
}
