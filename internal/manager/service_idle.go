package manager

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Idle timers: a sandbox created with an idle timeout is paused (block
// root) or destroyed (otherwise) once no exec, file or log call touched it
// for that long. The row is journaled like the timeout timer: due, then
// firing (before the node is asked), then done with the operation, so a
// server that stops in between completes the firing once when it starts.
//
// Touches are cheap: a touch only writes when the stored deadline is
// sooner than now+idle, and then sets now+idle+slack (slack = idle/10, at
// most a minute), so a busy sandbox costs a write per slack, and the timer
// fires at least idle after the last touch, at most slack later.

const idleMigration = `CREATE TABLE idle_timers (
		sandbox_id   TEXT PRIMARY KEY REFERENCES owned_sandboxes(id),
		idle_ms      INTEGER NOT NULL CHECK (idle_ms > 0),
		deadline     TEXT NOT NULL,
		state        TEXT NOT NULL CHECK (state IN ('armed', 'firing', 'done')),
		action       TEXT NOT NULL DEFAULT '',
		operation_id TEXT NOT NULL DEFAULT '',
		attempts     INTEGER NOT NULL DEFAULT 0,
		finished_at  TEXT
	);
	CREATE INDEX idle_timers_due ON idle_timers(state, deadline);`

// IdleTimer is a sandbox's idle timer.
type IdleTimer struct {
	SandboxID   string        `json:"sandbox_id"`
	Owner       string        `json:"owner"`
	Idle        time.Duration `json:"idle"`
	Deadline    time.Time     `json:"deadline"`
	State       string        `json:"state"`
	Action      string        `json:"action,omitempty"`
	OperationID string        `json:"operation_id,omitempty"`
	Attempts    int           `json:"attempts"`
}

// IdleSlack is how much later than idle after its last touch an idle
// timer may fire (the touches' write throttle).
func IdleSlack(idle time.Duration) time.Duration { return min(idle/10, time.Minute) }

const idleSelect = `SELECT t.sandbox_id, o.owner, t.idle_ms, t.deadline, t.state, t.action, t.operation_id, t.attempts FROM idle_timers t JOIN owned_sandboxes o ON o.id = t.sandbox_id`

func scanIdle(row rowScanner) (IdleTimer, error) {
	var t IdleTimer
	var deadline string
	var ms int64
	if err := row.Scan(&t.SandboxID, &t.Owner, &ms, &deadline, &t.State, &t.Action, &t.OperationID, &t.Attempts); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return t, notFound("idle timer not found")
		}
		return t, fmt.Errorf("read idle timer: %w", err)
	}
	t.Idle = time.Duration(ms) * time.Millisecond
	var err error
	t.Deadline, err = parseTS(deadline)
	return t, err
}

// TouchIdle records activity on owner's sandbox id at now: its armed idle
// timer moves to fire no sooner than idle after now. Another owner's
// sandbox, or one with no armed idle timer, is left as it is.
func (s *Store) TouchIdle(ctx context.Context, owner, id string, now time.Time) error {
	var ms int64
	var deadline string
	err := s.db.QueryRowContext(ctx, `SELECT t.idle_ms, t.deadline FROM idle_timers t JOIN owned_sandboxes o ON o.id = t.sandbox_id
		WHERE t.sandbox_id = ? AND o.owner = ? AND t.state = 'armed'`, id, owner).Scan(&ms, &deadline)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read idle timer of %s: %w", id, err)
	}
	idle := time.Duration(ms) * time.Millisecond
	d, err := parseTS(deadline)
	if err != nil {
		return err
	}
	if !d.Before(now.Add(idle)) {
		return nil
	}
	next := now.Add(idle + IdleSlack(idle))
	if _, err := s.db.ExecContext(ctx, `UPDATE idle_timers SET deadline = ? WHERE sandbox_id = ? AND state = 'armed' AND deadline < ?`, ts(next), id, ts(next)); err != nil {
		return fmt.Errorf("touch idle timer of %s: %w", id, err)
	}
	return nil
}

// RearmIdle arms a sandbox's idle timer again from now (a resume).
func (s *Store) RearmIdle(ctx context.Context, id string, now time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var ms int64
		err := tx.QueryRowContext(ctx, `SELECT idle_ms FROM idle_timers WHERE sandbox_id = ? AND state IN ('armed', 'done')`, id).Scan(&ms)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		} else if err != nil {
			return fmt.Errorf("read idle timer of %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE idle_timers SET state = 'armed', deadline = ?, action = '', operation_id = '', attempts = 0, finished_at = NULL WHERE sandbox_id = ?`,
			ts(now.Add(time.Duration(ms)*time.Millisecond)), id); err != nil {
			return fmt.Errorf("rearm idle timer of %s: %w", id, err)
		}
		return nil
	})
}

// DueIdle returns the idle timers of running (active, not paused)
// sandboxes past their deadline and every one left firing.
func (s *Store) DueIdle(ctx context.Context, now time.Time, limit int) ([]IdleTimer, error) {
	rows, err := s.db.QueryContext(ctx, idleSelect+` WHERE (t.state = 'armed' AND t.deadline <= ? AND o.active = 1 AND o.paused = 0) OR t.state = 'firing' ORDER BY t.deadline LIMIT ?`, ts(now), limit)
	if err != nil {
		return nil, fmt.Errorf("list due idle timers: %w", err)
	}
	return collect(rows, scanIdle)
}

// MarkIdleFiring records that a due idle timer fires, before the node is
// asked; ok is false when it is no longer due (touched, or its sandbox
// ended or paused meanwhile).
func (s *Store) MarkIdleFiring(ctx context.Context, id string) (IdleTimer, bool, error) {
	var t IdleTimer
	var ok bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		res, err := tx.ExecContext(ctx, `UPDATE idle_timers SET state = 'firing', attempts = attempts + 1
			WHERE sandbox_id = ? AND (state = 'firing' OR (state = 'armed' AND deadline <= ?
				AND EXISTS (SELECT 1 FROM owned_sandboxes o WHERE o.id = sandbox_id AND o.active = 1 AND o.paused = 0)))`, id, now)
		if err != nil {
			return fmt.Errorf("mark idle timer of %s firing: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("mark idle timer of %s firing: %w", id, err)
		}
		ok = n == 1
		t, err = scanIdle(tx.QueryRowContext(ctx, idleSelect+` WHERE t.sandbox_id = ?`, id))
		return err
	})
	return t, ok, err
}

// FinishIdle records a fired idle timer's outcome: action "pause" marks
// the sandbox paused; "destroy" with end ends its reservation (reason
// idle) and cancels its timeout timer. One transaction.
func (s *Store) FinishIdle(ctx context.Context, id, action, opID string, end bool) error {
	if action != "pause" && action != "destroy" {
		return fmt.Errorf("finish idle timer of %s: unknown action %q", id, action)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		res, err := tx.ExecContext(ctx, `UPDATE idle_timers SET state = 'done', action = ?, operation_id = ?, finished_at = ? WHERE sandbox_id = ? AND state = 'firing'`,
			action, opID, now, id)
		if err != nil {
			return fmt.Errorf("finish idle timer of %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return nil
		}
		switch {
		case action == "pause":
			if _, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET paused = 1 WHERE id = ?`, id); err != nil {
				return fmt.Errorf("record pause of %s: %w", id, err)
			}
		case end:
			if _, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET active = 0, reason = CASE WHEN reason = '' THEN 'idle' ELSE reason END, ended_at = ? WHERE id = ? AND active = 1`,
				now, id); err != nil {
				return fmt.Errorf("end sandbox %s: %w", id, err)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE timers SET state = 'cancelled', finished_at = ? WHERE sandbox_id = ? AND state = 'armed'`, now, id); err != nil {
				return fmt.Errorf("cancel timers of %s: %w", id, err)
			}
		}
		return nil
	})
}

// IdleTimer returns a sandbox's idle timer.
func (s *Store) IdleTimer(ctx context.Context, id string) (IdleTimer, error) {
	return scanIdle(s.db.QueryRowContext(ctx, idleSelect+` WHERE t.sandbox_id = ?`, id))
}
