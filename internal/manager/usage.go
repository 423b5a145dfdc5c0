package manager

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
)

// Usage metering (issue 22 §2): the records of each node's metering
// stream (ctld's GET /v1/usage), stored outbox-style: a node's records
// and its cursor (the last sequence number stored) are committed in one
// transaction, so a puller that dies, or two replicas pulling at once,
// neither lose a record nor store one twice (the cursor only moves up,
// and (node, seq) is the key).
//
// usageMigration also gives the idle timers the egress total last seen
// (the service counts egress growth as activity: idle.go there).
const usageMigration = `CREATE TABLE usage_records (
		node_id              TEXT NOT NULL,
		seq                  INTEGER NOT NULL,
		sandbox_id           TEXT NOT NULL,
		generation           INTEGER NOT NULL,
		final                INTEGER NOT NULL DEFAULT 0 CHECK (final IN (0, 1)),
		start_at             TEXT NOT NULL,
		end_at               TEXT NOT NULL,
		cpu_usec             INTEGER NOT NULL DEFAULT 0,
		memory_current_bytes INTEGER NOT NULL DEFAULT 0,
		memory_peak_bytes    INTEGER NOT NULL DEFAULT 0,
		pids_peak            INTEGER NOT NULL DEFAULT 0,
		io_read_bytes        INTEGER NOT NULL DEFAULT 0,
		io_write_bytes       INTEGER NOT NULL DEFAULT 0,
		disk_used_bytes      INTEGER NOT NULL DEFAULT 0,
		tx_bytes             INTEGER NOT NULL DEFAULT 0,
		tx_packets           INTEGER NOT NULL DEFAULT 0,
		dropped_packets      INTEGER NOT NULL DEFAULT 0,
		wall_ms              INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (node_id, seq)
	);
	CREATE INDEX usage_records_by_sandbox ON usage_records(sandbox_id, end_at);
	CREATE INDEX usage_records_by_end ON usage_records(end_at);
	CREATE TABLE usage_cursors (
		node_id    TEXT PRIMARY KEY,
		last_seq   INTEGER NOT NULL,
		updated_at TEXT NOT NULL
	);
	ALTER TABLE idle_timers ADD COLUMN egress_bytes INTEGER NOT NULL DEFAULT 0;`

// maxStoredCounter keeps a counter inside the databases' signed 64 bits.
const maxStoredCounter = 1<<63 - 1

func clampCounter(v uint64) int64 { return int64(min(v, maxStoredCounter)) }

// UsageCursor is the last sequence number of node's stream stored (0:
// none yet).
func (s *Store) UsageCursor(ctx context.Context, node string) (uint64, error) {
	var c int64
	err := s.db.QueryRowContext(ctx, `SELECT last_seq FROM usage_cursors WHERE node_id = ?`, node).Scan(&c)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read usage cursor of %s: %w", node, err)
	}
	return uint64(c), nil
}

// StoreUsage commits one page of node's stream: the records above the
// stored cursor and the cursor moved to next, in one transaction. It
// returns how many records were new. Records at or below the cursor (a
// page another puller stored first) are skipped; next below the cursor
// leaves it where it is.
func (s *Store) StoreUsage(ctx context.Context, node string, recs []api.UsageRecord, next uint64) (int, error) {
	if node == "" {
		return 0, errdefs.Errorf(errdefs.CodeInvalidArgument, "store usage: no node id")
	}
	var added int
	err := s.tx(ctx, func(tx *sql.Tx) error {
		added = 0
		var cur int64
		err := tx.QueryRowContext(ctx, `SELECT last_seq FROM usage_cursors WHERE node_id = ?`, node).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			cur = 0
		} else if err != nil {
			return fmt.Errorf("read usage cursor of %s: %w", node, err)
		}
		top := uint64(cur)
		for _, r := range recs {
			if r.Seq <= uint64(cur) {
				continue
			}
			if r.Seq > maxStoredCounter {
				return errdefs.Errorf(errdefs.CodeInvalidArgument, "usage record %d of %s: sequence out of range", r.Seq, node)
			}
			u := r.Usage
			res, err := tx.ExecContext(ctx, `INSERT INTO usage_records (node_id, seq, sandbox_id, generation, final, start_at, end_at,
				cpu_usec, memory_current_bytes, memory_peak_bytes, pids_peak, io_read_bytes, io_write_bytes, disk_used_bytes,
				tx_bytes, tx_packets, dropped_packets, wall_ms)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
				node, int64(r.Seq), r.SandboxID, clampCounter(r.Generation), boolInt(r.Final), ts(r.Start), ts(r.End),
				clampCounter(u.CPUUsec), clampCounter(u.MemoryCurrentBytes), clampCounter(u.MemoryPeakBytes), clampCounter(u.PIDsPeak),
				clampCounter(u.IOReadBytes), clampCounter(u.IOWriteBytes), clampCounter(u.DiskUsedBytes),
				clampCounter(u.TxBytes), clampCounter(u.TxPackets), clampCounter(u.DroppedPackets), clampCounter(u.WallMS))
			if err != nil {
				return fmt.Errorf("store usage record %d of %s: %w", r.Seq, node, err)
			}
			if n, _ := res.RowsAffected(); n > 0 {
				added++
			}
			top = max(top, r.Seq)
		}
		next = min(max(next, top), maxStoredCounter)
		if next <= uint64(cur) && cur != 0 {
			return nil
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO usage_cursors (node_id, last_seq, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (node_id) DO UPDATE SET last_seq = excluded.last_seq, updated_at = excluded.updated_at`,
			node, int64(next), ts(s.now()))
		if err != nil {
			return fmt.Errorf("move usage cursor of %s: %w", node, err)
		}
		return nil
	})
	return added, err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// UsageQuery selects records by the end of their period: Since <
// end <= Until (zero: unbounded), of one owner or one sandbox.
type UsageQuery struct {
	Owner     string
	SandboxID string
	Since     time.Time
	Until     time.Time
}

// UsageSum is the usage of a sandbox (or an owner's sandboxes) over a
// range: the counters summed, the levels' maximum.
type UsageSum struct {
	Owner     string    `json:"owner"`
	SandboxID string    `json:"sandbox_id,omitempty"`
	Records   int64     `json:"records"`
	Usage     api.Usage `json:"usage"`
}

// SumUsage sums the records q selects per sandbox (bySandbox) or per
// owner. Sandboxes the service does not own have owner "".
func (s *Store) SumUsage(ctx context.Context, q UsageQuery, bySandbox bool) ([]UsageSum, error) {
	group := "COALESCE(o.owner, '')"
	cols := group + ", ''"
	if bySandbox {
		group = "COALESCE(o.owner, ''), r.sandbox_id"
		cols = group
	}
	where, args := "1 = 1", []any{}
	if q.Owner != "" {
		where += " AND o.owner = ?"
		args = append(args, q.Owner)
	}
	if q.SandboxID != "" {
		where += " AND r.sandbox_id = ?"
		args = append(args, q.SandboxID)
	}
	if !q.Since.IsZero() {
		where += " AND r.end_at > ?"
		args = append(args, ts(q.Since))
	}
	if !q.Until.IsZero() {
		where += " AND r.end_at <= ?"
		args = append(args, ts(q.Until))
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+cols+`, COUNT(*),
		COALESCE(SUM(r.cpu_usec), 0), COALESCE(MAX(r.memory_current_bytes), 0), COALESCE(MAX(r.memory_peak_bytes), 0), COALESCE(MAX(r.pids_peak), 0),
		COALESCE(SUM(r.io_read_bytes), 0), COALESCE(SUM(r.io_write_bytes), 0), COALESCE(MAX(r.disk_used_bytes), 0),
		COALESCE(SUM(r.tx_bytes), 0), COALESCE(SUM(r.tx_packets), 0), COALESCE(SUM(r.dropped_packets), 0), COALESCE(SUM(r.wall_ms), 0)
		FROM usage_records r LEFT JOIN owned_sandboxes o ON o.id = r.sandbox_id
		WHERE `+where+` GROUP BY `+group+` ORDER BY `+group, args...)
	if err != nil {
		return nil, fmt.Errorf("sum usage: %w", err)
	}
	defer rows.Close()
	var out []UsageSum
	for rows.Next() {
		var u UsageSum
		var v [11]int64
		if err := rows.Scan(&u.Owner, &u.SandboxID, &u.Records, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10]); err != nil {
			return nil, fmt.Errorf("sum usage: %w", err)
		}
		u.Usage = api.Usage{CPUUsec: uint64(v[0]), MemoryCurrentBytes: uint64(v[1]), MemoryPeakBytes: uint64(v[2]), PIDsPeak: uint64(v[3]),
			IOReadBytes: uint64(v[4]), IOWriteBytes: uint64(v[5]), DiskUsedBytes: uint64(v[6]),
			TxBytes: uint64(v[7]), TxPackets: uint64(v[8]), DroppedPackets: uint64(v[9]), WallMS: uint64(v[10])}
		out = append(out, u)
	}
	return out, rows.Err()
}

// UsageSource is a node's metering stream (api.Client). UsageAck reads
// after a cursor and acknowledges the records up to it (stored: the node
// may drop them).
type UsageSource interface {
	Node(ctx context.Context) (api.Node, error)
	UsageAck(ctx context.Context, after uint64, limit int) (api.UsagePage, error)
}

// UsageStore is where a puller commits a node's records (*Store).
type UsageStore interface {
	UsageCursor(ctx context.Context, node string) (uint64, error)
	StoreUsage(ctx context.Context, node string, recs []api.UsageRecord, next uint64) (int, error)
}

var _ UsageStore = (*Store)(nil)

// UsagePuller pages a node's stream into the store.
type UsagePuller struct {
	Store  UsageStore
	Source UsageSource
	// Page is the records per read (0: 500).
	Page int
	Log  *slog.Logger
}

// PullOnce stores everything the node has after the stored cursor and
// returns how many records were new. A gap (the node's retention dropped
// records this store never had) is logged, and the cursor moves on.
func (p UsagePuller) PullOnce(ctx context.Context) (int, error) {
	n, err := p.Source.Node(ctx)
	if err != nil {
		return 0, fmt.Errorf("pull usage: identify node: %w", err)
	}
	page := p.Page
	if page <= 0 {
		page = 500
	}
	page = min(page, api.MaxUsageLimit)
	total := 0
	for ctx.Err() == nil {
		cur, err := p.Store.UsageCursor(ctx, n.NodeID)
		if err != nil {
			return total, err
		}
		// The read acknowledges cur: the store committed it.
		pg, err := p.Source.UsageAck(ctx, cur, page)
		if err != nil {
			return total, fmt.Errorf("pull usage of %s after %d: %w", n.NodeID, cur, err)
		}
		if pg.First > cur+1 && len(pg.Records) > 0 {
			logging.OrDiscard(p.Log).Warn("usage records lost to the node's retention before they were stored",
				"node", n.NodeID, "cursor", cur, "first_kept", pg.First)
		}
		if len(pg.Records) == 0 {
			return total, nil
		}
		added, err := p.Store.StoreUsage(ctx, n.NodeID, pg.Records, pg.Next)
		total += added
		if err != nil {
			return total, err
		}
		if len(pg.Records) < page {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// Run pulls every interval until ctx ends.
func (p UsagePuller) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := p.PullOnce(ctx); err != nil && ctx.Err() == nil {
			logging.OrDiscard(p.Log).Warn("pull usage records", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SeeIdleEgress records total, the egress counter of sandbox id's
// running generation, on its idle timer and reports whether it grew
// since the last look (egress is activity: the service's idle.go). A
// total below the one recorded is a new generation's counter (a resume):
// any egress of it is growth.
func (s *Store) SeeIdleEgress(ctx context.Context, id string, total uint64) (bool, error) {
	var grew bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		grew = false
		var seen int64
		err := tx.QueryRowContext(ctx, `SELECT egress_bytes FROM idle_timers WHERE sandbox_id = ?`, id).Scan(&seen)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		} else if err != nil {
			return fmt.Errorf("read idle egress of %s: %w", id, err)
		}
		v := clampCounter(total)
		if v == seen {
			return nil
		}
		grew = v > seen || v > 0
		if _, err := tx.ExecContext(ctx, `UPDATE idle_timers SET egress_bytes = ? WHERE sandbox_id = ?`, v, id); err != nil {
			return fmt.Errorf("record idle egress of %s: %w", id, err)
		}
		return nil
	})
	return grew, err
}
