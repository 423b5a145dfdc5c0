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

// exitGenerationMigration ties a recorded exit to the generation that
// exited (a resumed sandbox's new generation starts without one) and says
// whether the exit still asks for its sandbox's destroy (on_exit
// destroy): only those exited sandboxes stay to be looked at. Exits
// recorded before it are the sandbox's current generation's; those of an
// active sandbox whose create asked on_exit destroy are still to destroy.
const exitGenerationMigration = `ALTER TABLE owned_sandboxes ADD COLUMN exit_generation BIGINT NOT NULL DEFAULT 0;
	ALTER TABLE owned_sandboxes ADD COLUMN exit_destroy INTEGER NOT NULL DEFAULT 0;
	UPDATE owned_sandboxes SET exit_generation = COALESCE((SELECT generation FROM sandboxes WHERE sandboxes.id = owned_sandboxes.id), 0) WHERE exit <> '';
	UPDATE owned_sandboxes SET exit_destroy = 1 WHERE exit <> '' AND active = 1 AND spec LIKE '%"on_exit":"destroy"%';`

// ExitStore is the service store's part for on_exit.
type ExitStore interface {
	ExitCandidates(ctx context.Context, after string, limit int) ([]OwnedSandbox, error)
	RecordExit(ctx context.Context, id string, gen uint64, e SandboxExit, destroy bool) (first bool, err error)
}

// SandboxExit is how a sandbox's workload ended, as its node journaled it.
type SandboxExit struct {
	Kind string    `json:"kind"`
	Code int       `json:"code"`
	At   time.Time `json:"at"`
}

// ExitCandidates returns up to limit active, unpaused sandboxes with an id
// after after, in id order, that the exit watch has to look at: those the
// manager has ready (the service asks their node whether they exited),
// and those exited whose exit is not recorded for their generation or
// still asks for their destroy (on_exit destroy). An exited on_exit keep
// sandbox is done with, so it never fills a page; the caller pages on
// from the last id returned and starts over after a short page.
func (s *Store) ExitCandidates(ctx context.Context, after string, limit int) ([]OwnedSandbox, error) {
	out, err := collect(ctx, s.db, scanOwned, ownedSelect+` WHERE o.active = 1 AND o.paused = 0 AND o.id > ?
		AND (s.state = ? OR (s.state = ? AND (o.exit_generation <> s.generation OR o.exit_destroy = 1)))
		ORDER BY o.id LIMIT ?`,
		after, api.StateReady, api.StateExited, limit)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes to watch for exits: %w", err)
	}
	return out, nil
}

// RecordExit records, once per generation, that generation gen of sandbox
// id exited on its node: the exit on the owner's sandbox (for gen; destroy:
// its on_exit asks for the destroy) and state exited on the generation,
// in one transaction. first is false when it was recorded before (another
// replica, an earlier tick), so the exited event is sent once.
func (s *Store) RecordExit(ctx context.Context, id string, gen uint64, e SandboxExit, destroy bool) (first bool, err error) {
	b, err := json.Marshal(e)
	if err != nil {
		return false, fmt.Errorf("encode exit of %s: %w", id, err)
	}
	pending := 0
	if destroy {
		pending = 1
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET exit = ?, exit_generation = ?, exit_destroy = ?
			WHERE id = ? AND (exit = '' OR exit_generation <> ?)`, string(b), gen, pending, id, gen)
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

// exitOf decodes an owned sandbox's exit column (”: none) if it is
// generation gen's: a resumed sandbox's new generation has not exited.
func exitOf(raw string, exitGen, gen uint64) (*SandboxExit, error) {
	if raw == "" || exitGen != gen {
		return nil, nil
	}
	var e SandboxExit
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return nil, fmt.Errorf("decode exit: %w", err)
	}
	return &e, nil
}
