package manager

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
)

// Operation leases: with several `ctl-manager serve` replicas on one
// database, each service operation in flight (a create, a destroy, a
// timer's firing, an idempotent call) is a row here naming the replica
// that runs it and until when. The holder renews its leases while it is
// alive; a lease that expired belongs to a dead (or cut off) replica, and
// any replica may take it over and finish the operation, reusing the
// operation id the manager recorded for it, which ctld answers
// idempotently. Taking is a transaction: of two replicas racing for one
// lease, one gets it.

const opLeaseMigration = `CREATE TABLE op_leases (
		operation_id TEXT PRIMARY KEY,
		kind         TEXT NOT NULL,
		sandbox_id   TEXT NOT NULL DEFAULT '',
		owner        TEXT NOT NULL DEFAULT '',
		holder       TEXT NOT NULL,
		expires_at   TEXT NOT NULL,
		attempts     INTEGER NOT NULL DEFAULT 1,
		idem_owner   TEXT NOT NULL DEFAULT '',
		idem_key     TEXT NOT NULL DEFAULT '',
		request_hash TEXT NOT NULL DEFAULT '',
		created_at   TEXT NOT NULL
	);
	CREATE INDEX op_leases_by_holder ON op_leases(holder);
	CREATE INDEX op_leases_by_kind ON op_leases(kind, expires_at);
	CREATE INDEX op_leases_by_idem ON op_leases(idem_owner, idem_key);`

// OpLease is an operation's lease. ID names the operation (the service's
// "create/<sandbox>", "destroy/<sandbox>", ...); Attempts counts the
// replicas that took it (1: the one that started it). IdemOwner, IdemKey
// and RequestHash, when set, are the Idempotency-Key of the call that
// started it: whoever finishes the operation records that call's answer.
type OpLease struct {
	ID          string    `json:"operation_id"`
	Kind        string    `json:"kind"`
	SandboxID   string    `json:"sandbox_id,omitempty"`
	Owner       string    `json:"owner,omitempty"`
	Holder      string    `json:"holder"`
	ExpiresAt   time.Time `json:"expires_at"`
	Attempts    int       `json:"attempts"`
	IdemOwner   string    `json:"idem_owner,omitempty"`
	IdemKey     string    `json:"idem_key,omitempty"`
	RequestHash string    `json:"request_hash,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

// ErrLeaseHeld marks an admission refused because another live holder
// has its operation lease (Admission.Lease): nothing was recorded.
var ErrLeaseHeld = errors.New("operation lease held")

// LeaseStore keeps the operation leases.
type LeaseStore interface {
	TakeLease(ctx context.Context, l OpLease, ttl time.Duration) (OpLease, bool, error)
	RenewLeases(ctx context.Context, holder string, ids []string, ttl time.Duration) (int, error)
	ReleaseLease(ctx context.Context, id, holder string) error
	ExpireLease(ctx context.Context, id, holder string) error
	Lease(ctx context.Context, id string) (OpLease, error)
	ExpiredLeases(ctx context.Context, kind string, limit int) ([]OpLease, error)
	AbandonOrphanIdempotent(ctx context.Context, olderThan time.Time) (int, error)
	LastEventSeq(ctx context.Context) (int64, error)
}

var _ LeaseStore = (*Store)(nil)

// CheckReplicaID checks a replica id given by the operator: the shape
// of a sandbox id.
func CheckReplicaID(id string) error { return names.CheckID("replica id", id) }

const leaseSelect = `SELECT operation_id, kind, sandbox_id, owner, holder, expires_at, attempts, idem_owner, idem_key, request_hash, created_at FROM op_leases`

func scanLease(row rowScanner) (OpLease, error) {
	var l OpLease
	var exp, created string
	if err := row.Scan(&l.ID, &l.Kind, &l.SandboxID, &l.Owner, &l.Holder, &exp, &l.Attempts, &l.IdemOwner, &l.IdemKey, &l.RequestHash, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return l, notFound("operation lease not found")
		}
		return l, fmt.Errorf("read operation lease: %w", err)
	}
	var err error
	if l.ExpiresAt, err = parseTS(exp); err != nil {
		return l, err
	}
	l.CreatedAt, err = parseTS(created)
	return l, err
}

// TakeLease gives l.ID to l.Holder for ttl when no one holds it, its
// lease expired, or l.Holder holds it already: ok and the lease as now
// held. Otherwise ok is false and the lease is its live holder's. A
// takeover (another holder's expired lease) counts an attempt and keeps
// the operation's kind, sandbox and Idempotency-Key.
//
// It is one statement (takeLeaseTx) under the locking isolation: on
// PostgreSQL, racing takers of a lease wait for its row's lock and each
// decides on the row as the one before left it, instead of aborting as
// a serialization failure and running again (which under load gave up).
func (s *Store) TakeLease(ctx context.Context, l OpLease, ttl time.Duration) (OpLease, bool, error) {
	if l.ID == "" || l.Holder == "" || ttl <= 0 {
		return OpLease{}, false, errdefs.Errorf(errdefs.CodeInvalidArgument, "an operation lease needs an id, a holder and a positive TTL")
	}
	var out OpLease
	var ok bool
	err := s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) (err error) {
		// A commit that fails is run again: nothing of a try survives it.
		out, ok, err = takeLeaseTx(ctx, tx, l, ttl, s.now())
		return err
	})
	return out, ok, err
}

// takeLeaseTx is TakeLease in tx: one upsert that inserts the lease, or
// updates it when l.Holder holds it or it expired, and returns the row
// only if it did. A lease not taken is read back to name its holder; one
// let go in between is tried again.
func takeLeaseTx(ctx context.Context, tx *sql.Tx, l OpLease, ttl time.Duration, now time.Time) (OpLease, bool, error) {
	for range 3 {
		out, err := scanLease(tx.QueryRowContext(ctx, `INSERT INTO op_leases AS l (operation_id, kind, sandbox_id, owner, holder, expires_at, attempts, idem_owner, idem_key, request_hash, created_at)
			VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)
			ON CONFLICT (operation_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,
				attempts = l.attempts + CASE WHEN l.holder = excluded.holder THEN 0 ELSE 1 END
			WHERE l.holder = excluded.holder OR l.expires_at <= ?
			RETURNING operation_id, kind, sandbox_id, owner, holder, expires_at, attempts, idem_owner, idem_key, request_hash, created_at`,
			l.ID, l.Kind, l.SandboxID, l.Owner, l.Holder, ts(now.Add(ttl)), l.IdemOwner, l.IdemKey, l.RequestHash, ts(now), ts(now)))
		switch {
		case err == nil:
			return out, true, nil
		case errdefs.CodeOf(err) != errdefs.CodeNotFound:
			return OpLease{}, false, fmt.Errorf("take lease of %s: %w", l.ID, err)
		}
		// Not taken: another live holder has it.
		cur, err := scanLease(tx.QueryRowContext(ctx, leaseSelect+` WHERE operation_id = ?`, l.ID))
		switch {
		case err == nil:
			return cur, false, nil
		case errdefs.CodeOf(err) != errdefs.CodeNotFound:
			return OpLease{}, false, err
		}
	}
	return OpLease{}, false, errdefs.Busy(time.Second, "take lease of %s: let go and taken again as it was tried; retry", l.ID)
}

// RenewLeases moves the leases ids that holder holds to expire ttl from
// now (one statement per replica and tick for up to 500 operations): the
// count renewed. Only the operations the replica runs are named, so a
// lease it failed to let go (the database was down) still expires. A
// lease another replica took over stays the taker's.
func (s *Store) RenewLeases(ctx context.Context, holder string, ids []string, ttl time.Duration) (int, error) {
	var total int64
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 500)]
		ids = ids[len(batch):]
		args := []any{ts(s.now().Add(ttl)), holder}
		for _, id := range batch {
			args = append(args, id)
		}
		q := `UPDATE op_leases SET expires_at = ? WHERE holder = ? AND operation_id IN (?` + strings.Repeat(", ?", len(batch)-1) + `)`
		// One statement: it waits for a row a taker locked and then
		// skips it if taken over (READ COMMITTED re-reads the row).
		err := s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return fmt.Errorf("renew leases of %s: %w", holder, err)
			}
			n, err := res.RowsAffected()
			total += n
			return err
		})
		if err != nil {
			return int(total), err
		}
	}
	return int(total), nil
}

// ReleaseLease ends a finished operation's lease, if holder still holds
// it (one taken over is the taker's to end).
func (s *Store) ReleaseLease(ctx context.Context, id, holder string) error {
	return s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM op_leases WHERE operation_id = ? AND holder = ?`, id, holder); err != nil {
			return fmt.Errorf("release lease of %s: %w", id, err)
		}
		return nil
	})
}

// ExpireLease gives an unfinished operation up (its outcome is unknown:
// the node did not answer): the lease stays, expired, for any replica's
// sweeper to take and finish.
func (s *Store) ExpireLease(ctx context.Context, id, holder string) error {
	return s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE op_leases SET expires_at = ? WHERE operation_id = ? AND holder = ?`, ts(s.now()), id, holder); err != nil {
			return fmt.Errorf("expire lease of %s: %w", id, err)
		}
		return nil
	})
}

// Lease returns an operation's lease.
func (s *Store) Lease(ctx context.Context, id string) (OpLease, error) {
	return scanLease(s.db.QueryRowContext(ctx, leaseSelect+` WHERE operation_id = ?`, id))
}

// ExpiredLeases returns up to limit leases of kind that expired, the
// longest expired first: operations whose replica died or gave them up.
func (s *Store) ExpiredLeases(ctx context.Context, kind string, limit int) ([]OpLease, error) {
	out, err := collect(ctx, s.db, scanLease, leaseSelect+` WHERE kind = ? AND expires_at <= ? ORDER BY expires_at LIMIT ?`, kind, ts(s.now()), limit)
	if err != nil {
		return nil, fmt.Errorf("list expired %s leases: %w", kind, err)
	}
	return out, nil
}

// AbandonOrphanIdempotent forgets the pending Idempotency-Keys (recorded
// before olderThan) that no operation still answers for: no lease names
// the key, or only expired ones of calls that are not creates (a create
// taken over records its answer; any other call died with its replica,
// and a retry runs it again). Their expired leases go too.
func (s *Store) AbandonOrphanIdempotent(ctx context.Context, olderThan time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		res, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE state = 'pending' AND created_at < ? AND NOT EXISTS (
				SELECT 1 FROM op_leases l WHERE l.idem_owner = idempotency.owner AND l.idem_key = idempotency.key AND (l.expires_at > ? OR l.kind = 'create'))`,
			ts(olderThan), now)
		if err != nil {
			return fmt.Errorf("forget orphan idempotency keys: %w", err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM op_leases WHERE kind = 'call' AND expires_at <= ? AND NOT EXISTS (
				SELECT 1 FROM idempotency i WHERE i.owner = op_leases.idem_owner AND i.key = op_leases.idem_key AND i.state = 'pending')`, now); err != nil {
			return fmt.Errorf("forget expired call leases: %w", err)
		}
		return nil
	})
	return int(n), err
}

// LastEventSeq is the highest event sequence number journaled (0: none):
// where a live follower's polling of the journal starts, so it also gets
// the events other replicas journal.
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM service_events`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the last event: %w", err)
	}
	return n, nil
}
