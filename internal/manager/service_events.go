package manager

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// The service's events (created, ready, failed, ...), journaled so a
// follower resumes from its cursor (the event's sequence number) after a
// restart of the server. Sequence numbers only grow; old events are
// pruned.

const serviceEventsMigration = `CREATE TABLE service_events (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		owner      TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		type       TEXT NOT NULL,
		reason     TEXT NOT NULL DEFAULT '',
		at         TEXT NOT NULL
	);
	CREATE INDEX service_events_by_owner ON service_events(owner, seq);`

// ServiceEvent is one journaled event of an owner's sandbox.
type ServiceEvent struct {
	Seq       int64     `json:"seq"`
	Owner     string    `json:"owner"`
	SandboxID string    `json:"sandbox_id"`
	Type      string    `json:"type"`
	Reason    string    `json:"reason,omitempty"`
	Time      time.Time `json:"time"`
}

// AppendEvent journals ev and returns it with its sequence number (and
// the store's time when ev has none).
func (s *Store) AppendEvent(ctx context.Context, ev ServiceEvent) (ServiceEvent, error) {
	if ev.Time.IsZero() {
		ev.Time = s.now()
	}
	ev.Time = ev.Time.UTC()
	err := s.tx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `INSERT INTO service_events (owner, sandbox_id, type, reason, at) VALUES (?, ?, ?, ?, ?) RETURNING seq`,
			ev.Owner, ev.SandboxID, ev.Type, ev.Reason, ts(ev.Time)).Scan(&ev.Seq)
		if err != nil {
			return fmt.Errorf("journal event %s of %s: %w", ev.Type, ev.SandboxID, err)
		}
		return nil
	})
	return ev, err
}

// Events returns up to limit of owner's events after seq after (of one
// sandbox, unless sandbox is ""), in order.
func (s *Store) Events(ctx context.Context, owner, sandbox string, after int64, limit int) ([]ServiceEvent, error) {
	out, err := collect(ctx, s.db, func(r rowScanner) (ServiceEvent, error) {
		var ev ServiceEvent
		var at string
		if err := r.Scan(&ev.Seq, &ev.Owner, &ev.SandboxID, &ev.Type, &ev.Reason, &at); err != nil {
			return ev, fmt.Errorf("read event: %w", err)
		}
		var err error
		ev.Time, err = parseTS(at)
		return ev, err
	}, `SELECT seq, owner, sandbox_id, type, reason, at FROM service_events
		WHERE owner = ? AND seq > ? AND (? = '' OR sandbox_id = ?) ORDER BY seq LIMIT ?`, owner, after, sandbox, sandbox, limit)
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", owner, err)
	}
	return out, nil
}

// PruneEvents forgets the events journaled before before; a cursor older
// than that resumes from the oldest kept.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM service_events WHERE at < ?`, ts(before))
		if err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}
