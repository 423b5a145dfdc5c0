package manager

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// DefaultDBPath is where ctl-manager keeps its lifecycle truth.
const DefaultDBPath = "/var/lib/ctl-manager/manager.db"

// Operation kinds and states as stored.
const (
	KindClaim   = "claim"
	KindRelease = "release"

	OpPending = "pending"
	OpDone    = "done"
	OpFailed  = "failed"
)

// migrations are applied in order; PRAGMA user_version counts how many ran.
// Never edit an applied entry: append a new one.
var migrations = []string{
	`CREATE TABLE nodes (
		node_id    TEXT PRIMARY KEY,
		public_key BLOB,
		socket     TEXT NOT NULL,
		first_seen TEXT NOT NULL,
		last_seen  TEXT NOT NULL
	);
	CREATE TABLE sandboxes (
		id         TEXT PRIMARY KEY,
		created_at TEXT NOT NULL,
		state      TEXT NOT NULL,
		generation INTEGER NOT NULL DEFAULT 0,
		node_id    TEXT REFERENCES nodes(node_id)
	);
	CREATE TABLE generations (
		sandbox_id   TEXT NOT NULL REFERENCES sandboxes(id),
		generation   INTEGER NOT NULL,
		state        TEXT NOT NULL,
		container_id TEXT NOT NULL DEFAULT '',
		lease_id     TEXT NOT NULL DEFAULT '',
		resources    TEXT NOT NULL DEFAULT '{}',
		rootfs       TEXT NOT NULL DEFAULT '{}',
		timings      TEXT NOT NULL DEFAULT '{}',
		created_at   TEXT NOT NULL,
		ended_at     TEXT,
		PRIMARY KEY (sandbox_id, generation)
	);
	CREATE TABLE operations (
		operation_id TEXT PRIMARY KEY,
		kind         TEXT NOT NULL CHECK (kind IN ('claim', 'release')),
		sandbox_id   TEXT NOT NULL,
		generation   INTEGER NOT NULL,
		state        TEXT NOT NULL CHECK (state IN ('pending', 'done', 'failed')),
		request      TEXT NOT NULL DEFAULT '{}',
		error        TEXT NOT NULL DEFAULT '',
		created_at   TEXT NOT NULL,
		finished_at  TEXT,
		FOREIGN KEY (sandbox_id, generation) REFERENCES generations(sandbox_id, generation)
	);
	CREATE INDEX operations_by_sandbox ON operations(sandbox_id, state);
	CREATE TABLE proofs (
		operation_id TEXT PRIMARY KEY REFERENCES operations(operation_id),
		sandbox_id   TEXT NOT NULL,
		generation   INTEGER NOT NULL,
		json         TEXT NOT NULL,
		verified     INTEGER NOT NULL CHECK (verified IN (0, 1)),
		verify_error TEXT NOT NULL DEFAULT '',
		FOREIGN KEY (sandbox_id, generation) REFERENCES generations(sandbox_id, generation)
	);`,
	// 2: the network policy in force for a generation (the claim's, then
	// each live update's).
	`ALTER TABLE generations ADD COLUMN network TEXT NOT NULL DEFAULT '{}';`,
	// 3: the head of a block-mode sandbox's volume as its pauses
	// published it (the node's block store holds the truth; this is the
	// manager's compare-and-swap mirror).
	`CREATE TABLE heads (
		sandbox_id   TEXT PRIMARY KEY REFERENCES sandboxes(id),
		seq          INTEGER NOT NULL,
		generation   INTEGER NOT NULL,
		writer_epoch INTEGER NOT NULL,
		node_id      TEXT NOT NULL DEFAULT '',
		updated_at   TEXT NOT NULL
	);`,
	// 4: the highest head of each persistent volume the manager has seen
	// (volume create, each detach) and whether it deleted the volume: the
	// expected head its claims carry, so a bucket that rolled a head back
	// or lost a tombstone cannot bring an older disk back (issue 21).
	`CREATE TABLE volume_marks (
		volume_id  TEXT PRIMARY KEY,
		seq        INTEGER NOT NULL,
		generation INTEGER NOT NULL,
		deleted    INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
		updated_at TEXT NOT NULL
	);`,
	// 5, 6: a node's key before its last signed rotation, trusted for
	// proofs until previous_until (the overlap).
	`ALTER TABLE nodes ADD COLUMN previous_key BLOB;`,
	`ALTER TABLE nodes ADD COLUMN previous_until TEXT NOT NULL DEFAULT '';`,
	// 7: the service (ctl-manager serve): owners with quotas, API keys
	// (hashes only), sandboxes of an owner (the quota reservation), the
	// create log of the rate quota, idempotency records and timers.
	serviceMigration,
	// 8: the service's idle timers (idle_timeout_sec of a create).
	idleMigration,
	// 9: the service's persistent volumes of an owner and which sandbox
	// holds each.
	serviceVolumesMigration,
	// 10: the service's events, journaled for followers' cursors.
	serviceEventsMigration,
	// 11: the fleet's registered nodes and placement's capacity
	// reservations (nodes.go).
	fleetMigration,
	// 12: operation leases of the service's replicas (oplease.go).
	opLeaseMigration,
	// 13: how a service sandbox's workload ended (service_exits.go).
	exitMigration,
	// 14: a fleet node's stream channel address (nodes.go).
	`ALTER TABLE nodes ADD COLUMN channel TEXT NOT NULL DEFAULT '';`,
	// 15: usage records of the nodes' metering streams and their cursors;
	// the egress total an idle timer last saw (usage.go).
	usageMigration,
	// 16: a recorded exit's generation, and whether it asks for its
	// sandbox's destroy (service_exits.go).
	exitGenerationMigration,
	// 17: the exits node processes saw on their ctlds (fleet_exits.go).
	placedExitMigration,
	// 18: a node's sandboxes by state, which each heartbeat of its node
	// process reads (Abandoned, LostOn: readopt.go), as do the sweep and
	// drain.
	`CREATE INDEX sandboxes_by_node ON sandboxes(node_id, state);`,
	// 19: what a node's warm pool holds, which placement counts beside
	// the reservations (nodes.go, warmMigration).
	warmMigration,
}

// Store is the manager's database: SQLite (OpenStore, the embedded
// default) or PostgreSQL (OpenPostgres, store_pg.go). Both run the same
// SQL; what differs is in its dialect. Every method is one transaction.
type Store struct {
	db      *sql.DB
	now     func() time.Time
	dialect dialect
	// reruns counts transactions the database aborted as a conflict and
	// this store ran again (Reruns).
	reruns atomic.Uint64
	// afterNodeRead, if set (tests), runs in placement between its plain
	// read of the nodes and locking the chosen node's row.
	afterNodeRead func()
}

// Reruns is how many times this store ran a transaction again because the
// database aborted it as a serialization conflict or deadlock: the cost
// of contention between concurrent callers (replicas, requests).
func (s *Store) Reruns() uint64 { return s.reruns.Load() }

// dialect is what differs between the two backends.
type dialect struct {
	name string
	// migrate brings the schema up to migrations (in one transaction).
	migrate func(ctx context.Context, s *Store) error
	version func(ctx context.Context, q querier) (int, error)
	// txOpts for every transaction: nil on SQLite, whose IMMEDIATE
	// transactions run one at a time already.
	txOpts *sql.TxOptions
	// lockingTxOpts for a transaction that takes row locks for what it
	// decides on (Place: placement.go) instead of relying on txOpts:
	// PostgreSQL's READ COMMITTED, whose statements see the newest commits
	// and do not abort on a concurrent write to a row they read.
	lockingTxOpts *sql.TxOptions
	// forUpdate and skipLocked end a SELECT that locks the rows it reads
	// ("" on SQLite, where the write transaction holds the database).
	forUpdate, skipLocked string
	// retryable reports a transaction the database aborted to keep the
	// transactions serializable: it is run again (maxTxAttempts in all).
	retryable func(error) bool
	// classify gives a transaction's error its kind (PostgreSQL: a
	// database out of reach is unavailable); nil leaves it as it is.
	classify func(error) error
}

var sqliteDialect = dialect{name: "sqlite", migrate: migrateSQLite, version: sqliteVersion}

// Backend names the store's database: "sqlite" or "postgres".
func (s *Store) Backend() string { return s.dialect.name }

// OpenStore opens (creating if needed) the database at path and migrates it.
// now is the clock for recorded times; nil means time.Now.
func OpenStore(ctx context.Context, path string, now func() time.Time) (*Store, error) {
	if now == nil {
		now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create database dir: %w", err)
	}
	if err := createDBFile(path); err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	q := url.Values{}
	// Pragmas run on every new connection of the pool. WAL lets readers run
	// during a write; busy_timeout makes two CLI invocations wait for each
	// other instead of failing; IMMEDIATE transactions take the write lock
	// up front so read-then-write steps (next generation) cannot interleave.
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	s := &Store{db: db, now: now, dialect: sqliteDialect}
	if err := s.dialect.migrate(ctx, s); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func migrateSQLite(ctx context.Context, s *Store) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var v int
		if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		if v > len(migrations) {
			return fmt.Errorf("check schema version: database is version %d, this binary knows %d", v, len(migrations))
		}
		for i := v; i < len(migrations); i++ {
			if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
				return fmt.Errorf("apply migration %d: %w", i+1, err)
			}
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, len(migrations))); err != nil {
			return fmt.Errorf("write schema version: %w", err)
		}
		return nil
	})
}

// SchemaVersion returns how many migrations the database has.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	return s.dialect.version(ctx, s.db)
}

func sqliteVersion(ctx context.Context, q querier) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// maxTxAttempts bounds the runs of a transaction the database keeps
// aborting as a serialization conflict (PostgreSQL only).
const maxTxAttempts = 50

// tx runs fn in one transaction, again from the start while the database
// aborts it as a serialization conflict: fn must only assign what it
// returns, so a rerun replaces a failed run's results.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	return s.txWith(ctx, s.dialect.txOpts, fn)
}

// txWith is tx with the transaction's options (isolation) opts.
func (s *Store) txWith(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	err := s.txRetried(ctx, opts, fn)
	if err != nil && s.dialect.classify != nil {
		err = s.dialect.classify(err)
	}
	return err
}

func (s *Store) txRetried(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.tx1(ctx, opts, fn)
		if err == nil || s.dialect.retryable == nil || !s.dialect.retryable(err) {
			return err
		}
		s.reruns.Add(1)
		if attempt == maxTxAttempts {
			// Contention, not a fault: the caller may try again.
			return errdefs.Busy(time.Second, "run transaction: still conflicting after %d attempts: %w", attempt, err)
		}
		// Jittered, growing backoff: the conflicting transactions should
		// not meet again at once.
		d := time.Duration(1+rand.IntN(1<<min(attempt, 6))) * time.Millisecond
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(d):
		}
	}
}

func (s *Store) tx1(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// Records as stored.

// NodeRecord is a ctld node the manager has talked to. PublicKey is pinned
// on first use and replaced only by a rotation the pinned key signed.
type NodeRecord struct {
	NodeID    string `json:"node_id"`
	PublicKey []byte `json:"public_key,omitempty"`
	// PreviousKey is the key before the last signed rotation (RotateNodeKey),
	// still trusted for proofs until PreviousUntil.
	PreviousKey   []byte    `json:"previous_key,omitempty"`
	PreviousUntil time.Time `json:"previous_until,omitzero"`
	Socket        string    `json:"socket"`
	FirstSeen     time.Time `json:"first_seen"`
	LastSeen      time.Time `json:"last_seen"`
}

// SandboxRecord is a sandbox identity.
type SandboxRecord struct {
	ID         string           `json:"id"`
	CreatedAt  time.Time        `json:"created_at"`
	State      api.SandboxState `json:"state"`
	Generation uint64           `json:"generation"`
	NodeID     string           `json:"node_id,omitempty"`
}

// GenerationRecord is one runtime generation of a sandbox.
type GenerationRecord struct {
	SandboxID   string           `json:"sandbox_id"`
	Generation  uint64           `json:"generation"`
	State       api.SandboxState `json:"state"`
	ContainerID string           `json:"container_id,omitempty"`
	LeaseID     string           `json:"lease_id,omitempty"`
	Resources   api.Resources    `json:"resources"`
	RootFS      api.RootFS       `json:"rootfs"`
	// Network is the policy in force: the claim's, replaced by each live
	// update the node accepted (Manager.UpdateNetwork).
	Network   api.NetworkPolicy `json:"network"`
	Timings   api.Timings       `json:"timings"`
	CreatedAt time.Time         `json:"created_at"`
	EndedAt   *time.Time        `json:"ended_at,omitempty"`
}

// OperationRecord is a mutating call to ctld, recorded before it is made.
type OperationRecord struct {
	OperationID string `json:"operation_id"`
	Kind        string `json:"kind"`
	SandboxID   string `json:"sandbox_id"`
	Generation  uint64 `json:"generation"`
	State       string `json:"state"`
	// Request is what the operation asks for (a claim's Spec as JSON), so
	// a retry sends exactly what the first try sent.
	Request    json.RawMessage `json:"request,omitempty"`
	Error      string          `json:"error,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
}

// ProofRecord is a cleanup proof and the manager's verdict on it.
type ProofRecord struct {
	OperationID string           `json:"operation_id"`
	SandboxID   string           `json:"sandbox_id"`
	Generation  uint64           `json:"generation"`
	Proof       api.CleanupProof `json:"proof"`
	Verified    bool             `json:"verified"`
	VerifyError string           `json:"verify_error,omitempty"`
}

// tsLayout is RFC 3339 in UTC with all nine fraction digits: stored times
// are compared and sorted as text (deadline <= now), which needs one
// width (RFC3339Nano drops trailing zeros, and "10Z" sorts after "10.5Z").
const tsLayout = "2006-01-02T15:04:05.000000000Z07:00"

func ts(t time.Time) string { return t.UTC().Format(tsLayout) }

func parseTS(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse stored time %q: %w", s, err)
	}
	return t, nil
}

func parseNullTS(ns sql.NullString) (*time.Time, error) {
	if !ns.Valid {
		return nil, nil
	}
	t, err := parseTS(ns.String)
	return &t, err
}

func notFound(format string, args ...any) error {
	return errdefs.Errorf(errdefs.CodeNotFound, format, args...)
}

// live reports whether a sandbox state holds compute on the node (or may:
// a claim or release in flight).
func live(state api.SandboxState) bool {
	switch state {
	case api.StateClaiming, api.StateReady, api.StateReleasing, api.StateLost, api.StateExited:
		return true
	}
	return false
}

// PinNode records contact with a node. The first key seen for a node is
// pinned (trust on first use); a later, different key is never stored. The
// returned record carries the pinned key, which the caller compares.
func (s *Store) PinNode(ctx context.Context, nodeID, socket string, key []byte) (NodeRecord, error) {
	var rec NodeRecord
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		var k []byte
		if len(key) > 0 {
			k = key
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO nodes (node_id, public_key, socket, first_seen, last_seen)
			VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (node_id) DO UPDATE SET
				socket = excluded.socket,
				last_seen = excluded.last_seen,
				public_key = COALESCE(nodes.public_key, excluded.public_key)`,
			nodeID, k, socket, now, now); err != nil {
			return fmt.Errorf("record node %s: %w", nodeID, err)
		}
		r, err := scanNode(tx.QueryRowContext(ctx, nodeSelect+` WHERE node_id = ?`, nodeID))
		rec = r
		return err
	})
	return rec, err
}

const nodeSelect = `SELECT node_id, public_key, socket, first_seen, last_seen, previous_key, previous_until FROM nodes`

type rowScanner interface{ Scan(dest ...any) error }

// collect runs a query and scans each row with scan: the one loop of the
// list methods, for both backends.
func collect[T any](ctx context.Context, q querier, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func scanNode(row rowScanner) (NodeRecord, error) {
	var r NodeRecord
	var first, last, until string
	if err := row.Scan(&r.NodeID, &r.PublicKey, &r.Socket, &first, &last, &r.PreviousKey, &until); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, notFound("node not known to the manager")
		}
		return r, fmt.Errorf("read node: %w", err)
	}
	var err error
	if r.FirstSeen, err = parseTS(first); err != nil {
		return r, err
	}
	if until != "" {
		if r.PreviousUntil, err = parseTS(until); err != nil {
			return r, err
		}
	}
	r.LastSeen, err = parseTS(last)
	return r, err
}

// Node returns a known node.
func (s *Store) Node(ctx context.Context, nodeID string) (NodeRecord, error) {
	r, err := scanNode(s.db.QueryRowContext(ctx, nodeSelect+` WHERE node_id = ?`, nodeID))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return r, notFound("node %s not known to the manager", nodeID)
	}
	return r, err
}

// Nodes returns every known node.
func (s *Store) Nodes(ctx context.Context) ([]NodeRecord, error) {
	out, err := collect(ctx, s.db, scanNode, nodeSelect+` ORDER BY node_id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

const sandboxSelect = `SELECT id, created_at, state, generation, COALESCE(node_id, '') FROM sandboxes`

func scanSandbox(row rowScanner) (SandboxRecord, error) {
	var r SandboxRecord
	var created string
	if err := row.Scan(&r.ID, &created, &r.State, &r.Generation, &r.NodeID); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, notFound("sandbox not known to the manager")
		}
		return r, fmt.Errorf("read sandbox: %w", err)
	}
	var err error
	r.CreatedAt, err = parseTS(created)
	return r, err
}

// Sandbox returns one sandbox; a missing one is a not_found *errdefs.Error.
func (s *Store) Sandbox(ctx context.Context, id string) (SandboxRecord, error) {
	return sandboxTx(ctx, s.db, id)
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func sandboxTx(ctx context.Context, q querier, id string) (SandboxRecord, error) {
	r, err := scanSandbox(q.QueryRowContext(ctx, sandboxSelect+` WHERE id = ?`, id))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return r, notFound("sandbox %s not known to the manager", id)
	}
	return r, err
}

// Sandboxes returns every sandbox, ordered by id.
func (s *Store) Sandboxes(ctx context.Context) ([]SandboxRecord, error) {
	out, err := collect(ctx, s.db, scanSandbox, sandboxSelect+` ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

const generationSelect = `SELECT sandbox_id, generation, state, container_id, lease_id, resources, rootfs, network, timings, created_at, ended_at FROM generations`

func scanGeneration(row rowScanner) (GenerationRecord, error) {
	var r GenerationRecord
	var res, rootfs, network, timings, created string
	var ended sql.NullString
	if err := row.Scan(&r.SandboxID, &r.Generation, &r.State, &r.ContainerID, &r.LeaseID, &res, &rootfs, &network, &timings, &created, &ended); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, notFound("generation not known to the manager")
		}
		return r, fmt.Errorf("read generation: %w", err)
	}
	if err := errors.Join(
		json.Unmarshal([]byte(res), &r.Resources),
		json.Unmarshal([]byte(rootfs), &r.RootFS),
		json.Unmarshal([]byte(network), &r.Network),
		json.Unmarshal([]byte(timings), &r.Timings),
	); err != nil {
		return r, fmt.Errorf("decode generation %s/%d: %w", r.SandboxID, r.Generation, err)
	}
	var err error
	if r.CreatedAt, err = parseTS(created); err != nil {
		return r, err
	}
	r.EndedAt, err = parseNullTS(ended)
	return r, err
}

// Generations returns a sandbox's generations, oldest first.
func (s *Store) Generations(ctx context.Context, id string) ([]GenerationRecord, error) {
	out, err := collect(ctx, s.db, scanGeneration, generationSelect+` WHERE sandbox_id = ? ORDER BY generation`, id)
	if err != nil {
		return nil, fmt.Errorf("list generations of %s: %w", id, err)
	}
	return out, nil
}

const operationColumns = `operation_id, kind, sandbox_id, generation, state, request, error, created_at, finished_at`

const operationSelect = `SELECT ` + operationColumns + ` FROM operations`

func scanOperation(row rowScanner) (OperationRecord, error) {
	var r OperationRecord
	var created, request string
	var finished sql.NullString
	if err := row.Scan(&r.OperationID, &r.Kind, &r.SandboxID, &r.Generation, &r.State, &request, &r.Error, &created, &finished); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, notFound("operation not known to the manager")
		}
		return r, fmt.Errorf("read operation: %w", err)
	}
	if request != "{}" {
		r.Request = json.RawMessage(request)
	}
	var err error
	if r.CreatedAt, err = parseTS(created); err != nil {
		return r, err
	}
	r.FinishedAt, err = parseNullTS(finished)
	return r, err
}

// Operation returns one operation.
func (s *Store) Operation(ctx context.Context, opID string) (OperationRecord, error) {
	r, err := scanOperation(s.db.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return r, notFound("operation %s not known to the manager", opID)
	}
	return r, err
}

// Operations returns a sandbox's operations, oldest first.
func (s *Store) Operations(ctx context.Context, id string) ([]OperationRecord, error) {
	out, err := collect(ctx, s.db, scanOperation, operationSelect+` WHERE sandbox_id = ? ORDER BY created_at, operation_id`, id)
	if err != nil {
		return nil, fmt.Errorf("list operations of %s: %w", id, err)
	}
	return out, nil
}

func pendingOp(ctx context.Context, tx *sql.Tx, id, kind string) (OperationRecord, bool, error) {
	r, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE sandbox_id = ? AND kind = ? AND state = 'pending' ORDER BY created_at DESC LIMIT 1`, id, kind))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return r, false, nil
	}
	return r, err == nil, err
}

// ClaimIntent is what BeginClaim records before ctld is called.
type ClaimIntent struct {
	SandboxID   string
	NodeID      string
	OperationID string // used only when no claim is pending
	Resources   api.Resources
	RootFS      api.RootFS
	Network     api.NetworkPolicy
	// Request is recorded with the operation (see OperationRecord).
	Request json.RawMessage
	// NodeGeneration is the newest generation the node reports for the
	// sandbox: a store that lost track (a fresh database, another manager)
	// must still ask for a newer one, or the node refuses the claim.
	NodeGeneration uint64
}

// BeginClaim records a claim before it is sent. If a claim for the sandbox
// is still pending (the manager crashed or lost the answer), that operation
// is returned with reused=true so the retry carries the same operation id
// and ctld answers it idempotently. Otherwise the next generation is
// allocated and in.OperationID recorded as pending. A sandbox that holds
// compute is a conflict.
func (s *Store) BeginClaim(ctx context.Context, in ClaimIntent) (op OperationRecord, reused bool, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		pending, ok, err := pendingOp(ctx, tx, in.SandboxID, KindClaim)
		if err != nil {
			return err
		}
		if ok {
			op, reused = pending, true
			return nil
		}
		now := ts(s.now())
		sb, err := sandboxTx(ctx, tx, in.SandboxID)
		switch {
		case errdefs.CodeOf(err) == errdefs.CodeNotFound:
			if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (id, created_at, state, generation, node_id) VALUES (?, ?, ?, 0, NULLIF(?, ''))`,
				in.SandboxID, now, api.StateClaiming, in.NodeID); err != nil {
				return fmt.Errorf("record sandbox %s: %w", in.SandboxID, err)
			}
		case err != nil:
			return err
		case live(sb.State):
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s is %s (generation %d); destroy it first", sb.ID, sb.State, sb.Generation)
		}
		gen := max(sb.Generation, in.NodeGeneration) + 1
		res, _ := json.Marshal(in.Resources)
		rootfs, _ := json.Marshal(in.RootFS)
		network, _ := json.Marshal(in.Network)
		if _, err := tx.ExecContext(ctx, `INSERT INTO generations (sandbox_id, generation, state, resources, rootfs, network, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			in.SandboxID, gen, api.StateClaiming, string(res), string(rootfs), string(network), now); err != nil {
			return fmt.Errorf("record generation %s/%d: %w", in.SandboxID, gen, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, generation = ?, node_id = NULLIF(?, ''), reason = '' WHERE id = ?`,
			api.StateClaiming, gen, in.NodeID, in.SandboxID); err != nil {
			return fmt.Errorf("update sandbox %s: %w", in.SandboxID, err)
		}
		request := "{}"
		if len(in.Request) > 0 {
			request = string(in.Request)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, request, created_at) VALUES (?, 'claim', ?, ?, 'pending', ?, ?)`,
			in.OperationID, in.SandboxID, gen, request, now); err != nil {
			return fmt.Errorf("record operation %s: %w", in.OperationID, err)
		}
		op, err = scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, in.OperationID))
		return err
	})
	return op, reused, err
}

// FinishClaim records a claim's answer: the generation is what ctld says.
func (s *Store) FinishClaim(ctx context.Context, opID string, sb api.Sandbox) error {
	return s.tx(ctx, func(tx *sql.Tx) error { return s.finishClaimTx(ctx, tx, opID, sb) })
}

func (s *Store) finishClaimTx(ctx context.Context, tx *sql.Tx, opID string, sb api.Sandbox) error {
	{
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("finish claim %s: %w", opID, err)
		}
		now := ts(s.now())
		timings, _ := json.Marshal(sb.Timings)
		res, _ := json.Marshal(sb.Resources)
		state := sb.State
		if state == "" {
			state = api.StateReady
		}
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ?, container_id = ?, lease_id = ?, timings = ?, resources = ? WHERE sandbox_id = ? AND generation = ?`,
			state, sb.ContainerID, sb.LeaseID, string(timings), string(res), op.SandboxID, op.Generation); err != nil {
			return fmt.Errorf("update generation %s/%d: %w", op.SandboxID, op.Generation, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ? WHERE id = ? AND generation = ?`, state, op.SandboxID, op.Generation); err != nil {
			return fmt.Errorf("update sandbox %s: %w", op.SandboxID, err)
		}
		return finishOp(ctx, tx, opID, OpDone, "", now)
	}
}

// SetNetwork records the network policy now in force for a generation
// (after the node accepted a live update); not_found if the store does
// not know the generation.
func (s *Store) SetNetwork(ctx context.Context, id string, gen uint64, p api.NetworkPolicy) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode network policy: %w", err)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE generations SET network = ? WHERE sandbox_id = ? AND generation = ?`, string(b), id, gen)
		if err != nil {
			return fmt.Errorf("record network policy of %s/%d: %w", id, gen, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return errors.Join(err, notFound("generation %s/%d not known to the manager", id, gen))
		}
		return nil
	})
}

func finishOp(ctx context.Context, tx *sql.Tx, opID, state, msg, now string) error {
	if _, err := tx.ExecContext(ctx, `UPDATE operations SET state = ?, error = ?, finished_at = ? WHERE operation_id = ?`, state, msg, now, opID); err != nil {
		return fmt.Errorf("finish operation %s: %w", opID, err)
	}
	return nil
}

// FailOperation records that ctld refused an operation for good, msg
// saying why (required). A failed claim fails its generation with msg as
// the sandbox's reason, in the same transaction: no reader sees the
// sandbox failed without it. A failed release leaves the sandbox state as
// it was before the release, since ctld still has it.
func (s *Store) FailOperation(ctx context.Context, opID, msg string) error {
	if msg == "" {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "fail operation %s: no reason given", opID)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("fail operation %s: %w", opID, err)
		}
		now := ts(s.now())
		switch op.Kind {
		case KindClaim:
			return failClaimTx(ctx, tx, op, msg, now)
		case KindRelease:
			// Only a release of the sandbox's current generation moves
			// it back: a stale generation's (taken over elsewhere) must
			// not overwrite the new one's state.
			if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = (SELECT state FROM generations WHERE sandbox_id = ? AND generation = ?) WHERE id = ? AND generation = ?`,
				op.SandboxID, op.Generation, op.SandboxID, op.Generation); err != nil {
				return fmt.Errorf("update sandbox %s: %w", op.SandboxID, err)
			}
		}
		return finishOp(ctx, tx, opID, OpFailed, msg, now)
	})
}

// AdoptSandbox records a sandbox the manager did not create (found on the
// node), so it can be destroyed with a recorded operation.
func (s *Store) AdoptSandbox(ctx context.Context, nodeID string, sb api.Sandbox) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		created := now
		if !sb.CreatedAt.IsZero() {
			created = ts(sb.CreatedAt)
		}
		res, _ := json.Marshal(sb.Resources)
		rootfs, _ := json.Marshal(sb.RootFS)
		timings, _ := json.Marshal(sb.Timings)
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (id, created_at, state, generation, node_id) VALUES (?, ?, ?, ?, NULLIF(?, ''))`,
			sb.ID, created, sb.State, sb.Generation, nodeID); err != nil {
			return fmt.Errorf("adopt sandbox %s: %w", sb.ID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO generations (sandbox_id, generation, state, container_id, lease_id, resources, rootfs, timings, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sb.ID, sb.Generation, sb.State, sb.ContainerID, sb.LeaseID, string(res), string(rootfs), string(timings), created); err != nil {
			return fmt.Errorf("adopt generation %s/%d: %w", sb.ID, sb.Generation, err)
		}
		return nil
	})
}

// BeginRelease records a release of the sandbox's current generation before
// it is sent, reusing a pending one like BeginClaim does. An unknown
// sandbox is not_found; a released one, or one whose claim is still
// pending, is a conflict.
func (s *Store) BeginRelease(ctx context.Context, id, newOpID string) (op OperationRecord, reused bool, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		op, reused, err = s.beginReleaseTx(ctx, tx, id, newOpID, "")
		return err
	})
	return op, reused, err
}

// beginReleaseTx is BeginRelease in tx; request is recorded with a new
// release ("" none; a fleet pause says so there: fleet.go).
func (s *Store) beginReleaseTx(ctx context.Context, tx *sql.Tx, id, newOpID, request string) (op OperationRecord, reused bool, err error) {
	err = func() error {
		pending, ok, err := pendingOp(ctx, tx, id, KindRelease)
		if err != nil {
			return err
		}
		if ok {
			op, reused = pending, true
			return nil
		}
		sb, err := sandboxTx(ctx, tx, id)
		if err != nil {
			return err
		}
		if sb.Generation == 0 {
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s has no generation to release", id)
		}
		if _, ok, err := pendingOp(ctx, tx, id, KindClaim); err != nil {
			return err
		} else if ok {
			// Releasing the generation a pending claim may still create
			// would race it; the claim has to be retried (or fail) first.
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s has a pending claim of generation %d; retry the create first", id, sb.Generation)
		}
		if sb.State == api.StateReleased {
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d is already released", id, sb.Generation)
		}
		now := ts(s.now())
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ? WHERE id = ?`, api.StateReleasing, id); err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, request, created_at) VALUES (?, 'release', ?, ?, 'pending', ?, ?)`,
			newOpID, id, sb.Generation, cmp.Or(request, "{}"), now); err != nil {
			return fmt.Errorf("record operation %s: %w", newOpID, err)
		}
		op, err = scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, newOpID))
		return err
	}()
	return op, reused, err
}

// FinishRelease records a release's answer and its proof with the
// manager's verdict, in one transaction.
func (s *Store) FinishRelease(ctx context.Context, opID string, sb api.Sandbox, p ProofRecord) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("finish release %s: %w", opID, err)
		}
		now := ts(s.now())
		state := sb.State
		if state == "" {
			state = api.StateReleased
		}
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ?, ended_at = ? WHERE sandbox_id = ? AND generation = ?`,
			state, now, op.SandboxID, op.Generation); err != nil {
			return fmt.Errorf("update generation %s/%d: %w", op.SandboxID, op.Generation, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ? WHERE id = ? AND generation = ?`, state, op.SandboxID, op.Generation); err != nil {
			return fmt.Errorf("update sandbox %s: %w", op.SandboxID, err)
		}
		if err := finishOp(ctx, tx, opID, OpDone, "", now); err != nil {
			return err
		}
		p.OperationID, p.SandboxID, p.Generation = op.OperationID, op.SandboxID, op.Generation
		return saveProof(ctx, tx, p)
	})
}

func saveProof(ctx context.Context, tx *sql.Tx, p ProofRecord) error {
	b, err := json.Marshal(p.Proof)
	if err != nil {
		return fmt.Errorf("encode proof %s: %w", p.OperationID, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO proofs (operation_id, sandbox_id, generation, json, verified, verify_error) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (operation_id) DO UPDATE SET json = excluded.json, verified = excluded.verified, verify_error = excluded.verify_error`,
		p.OperationID, p.SandboxID, p.Generation, string(b), p.Verified, p.VerifyError); err != nil {
		return fmt.Errorf("record proof %s: %w", p.OperationID, err)
	}
	return nil
}

// SaveProof records (or re-records) a proof and its verdict. Its operation
// must be known.
func (s *Store) SaveProof(ctx context.Context, p ProofRecord) error {
	return s.tx(ctx, func(tx *sql.Tx) error { return saveProof(ctx, tx, p) })
}

// Proof returns a stored proof.
func (s *Store) Proof(ctx context.Context, opID string) (ProofRecord, error) {
	var r ProofRecord
	var js string
	err := s.db.QueryRowContext(ctx, `SELECT operation_id, sandbox_id, generation, json, verified, verify_error FROM proofs WHERE operation_id = ?`, opID).
		Scan(&r.OperationID, &r.SandboxID, &r.Generation, &js, &r.Verified, &r.VerifyError)
	if errors.Is(err, sql.ErrNoRows) {
		return r, notFound("no proof stored for operation %s", opID)
	}
	if err != nil {
		return r, fmt.Errorf("read proof %s: %w", opID, err)
	}
	if err := json.Unmarshal([]byte(js), &r.Proof); err != nil {
		return r, fmt.Errorf("decode proof %s: %w", opID, err)
	}
	return r, nil
}

// Head returns the sandbox volume's head as recorded (Seq 0: none).
func (s *Store) Head(ctx context.Context, id string) (api.VolumeHead, error) {
	var h api.VolumeHead
	err := s.db.QueryRowContext(ctx, `SELECT seq, generation, writer_epoch, node_id FROM heads WHERE sandbox_id = ?`, id).
		Scan(&h.Seq, &h.Generation, &h.WriterEpoch, &h.Node)
	if errors.Is(err, sql.ErrNoRows) {
		return api.VolumeHead{}, nil
	}
	if err != nil {
		return h, fmt.Errorf("read head of %s: %w", id, err)
	}
	return h, nil
}

// PublishHead records h as the sandbox's head iff it is newer than the
// recorded one (a higher Seq) and of a writer epoch not older: the node's
// block store is the compare-and-swap's truth, and this record only ever
// moves forward, so two managers (or a late answer) cannot move it back.
// A stale head is fenced and changes nothing.
func (s *Store) PublishHead(ctx context.Context, id string, h api.VolumeHead) error {
	return s.tx(ctx, func(tx *sql.Tx) error { return s.publishHeadTx(ctx, tx, id, h) })
}

func (s *Store) publishHeadTx(ctx context.Context, tx *sql.Tx, id string, h api.VolumeHead) error {
	{
		var cur api.VolumeHead
		err := tx.QueryRowContext(ctx, `SELECT seq, writer_epoch FROM heads WHERE sandbox_id = ?`, id).Scan(&cur.Seq, &cur.WriterEpoch)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read head of %s: %w", id, err)
		}
		if h.Seq <= cur.Seq || h.WriterEpoch < cur.WriterEpoch {
			return errdefs.Errorf(errdefs.CodeFenced, "head of %s: recorded %d (writer epoch %d); %d (writer epoch %d) is not newer",
				id, cur.Seq, cur.WriterEpoch, h.Seq, h.WriterEpoch)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO heads (sandbox_id, seq, generation, writer_epoch, node_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (sandbox_id) DO UPDATE SET seq = excluded.seq, generation = excluded.generation, writer_epoch = excluded.writer_epoch,
			node_id = excluded.node_id, updated_at = excluded.updated_at`,
			id, h.Seq, h.Generation, h.WriterEpoch, h.Node, ts(s.now())); err != nil {
			return fmt.Errorf("record head of %s: %w", id, err)
		}
		return nil
	}
}

// VolumeMark returns the highest head of persistent volume id the manager
// has seen (Seq 0: none) and whether it deleted the volume.
func (s *Store) VolumeMark(ctx context.Context, id string) (api.VolumeHead, bool, error) {
	var h api.VolumeHead
	var deleted bool
	err := s.db.QueryRowContext(ctx, `SELECT seq, generation, deleted FROM volume_marks WHERE volume_id = ?`, id).Scan(&h.Seq, &h.Generation, &deleted)
	if errors.Is(err, sql.ErrNoRows) {
		return api.VolumeHead{}, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("read head mark of volume %s: %w", id, err)
	}
	return h, deleted, nil
}

// RaiseVolumeMark moves volume id's mark up to h (a lower or equal Seq
// changes nothing: the mark never moves back).
func (s *Store) RaiseVolumeMark(ctx context.Context, id string, h api.VolumeHead) error {
	if h.Seq == 0 {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO volume_marks (volume_id, seq, generation, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (volume_id) DO UPDATE SET seq = excluded.seq, generation = excluded.generation, updated_at = excluded.updated_at
		WHERE excluded.seq > volume_marks.seq`, id, h.Seq, h.Generation, ts(s.now())); err != nil {
		return fmt.Errorf("record head mark of volume %s: %w", id, err)
	}
	return nil
}

// MarkVolumeDeleted remembers that volume id was deleted: the bucket's
// tombstone is not trusted to stay, so claims naming it are refused here.
func (s *Store) MarkVolumeDeleted(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO volume_marks (volume_id, seq, generation, deleted, updated_at) VALUES (?, 0, 0, 1, ?)
		ON CONFLICT (volume_id) DO UPDATE SET deleted = 1, updated_at = excluded.updated_at`, id, ts(s.now())); err != nil {
		return fmt.Errorf("record the deletion of volume %s: %w", id, err)
	}
	return nil
}

// RotateNodeKey moves node nodeID's pinned key from old to next iff old is
// still the pinned key (the caller verified the rotation old signed);
// old stays trusted for proofs until until. Anything else is a conflict
// and changes nothing.
func (s *Store) RotateNodeKey(ctx context.Context, nodeID string, old, next []byte, until time.Time) (NodeRecord, error) {
	var rec NodeRecord
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET public_key = ?, previous_key = ?, previous_until = ? WHERE node_id = ? AND public_key = ?`,
			next, old, ts(until), nodeID, old)
		if err != nil {
			return fmt.Errorf("rotate key of node %s: %w", nodeID, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return errdefs.Errorf(errdefs.CodeConflict, "rotate key of node %s: the pinned key is no longer %x (%v)", nodeID, old, err)
		}
		rec, err = scanNode(tx.QueryRowContext(ctx, nodeSelect+` WHERE node_id = ?`, nodeID))
		return err
	})
	return rec, err
}

// TrustedKeys are the keys rec's proofs may be signed with at now: the
// pinned key, and the previous one during its overlap.
func (rec NodeRecord) TrustedKeys(now time.Time) [][]byte {
	var out [][]byte
	if len(rec.PublicKey) > 0 {
		out = append(out, rec.PublicKey)
	}
	if len(rec.PreviousKey) > 0 && now.Before(rec.PreviousUntil) {
		out = append(out, rec.PreviousKey)
	}
	return out
}
