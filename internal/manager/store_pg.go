package manager

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ctld/ctld/internal/errdefs"
)

// The PostgreSQL backend: the Store's own SQL, run through pgx's
// database/sql driver. Three things differ from SQLite and live here:
//
//   - placeholders: the shared SQL writes ?, PostgreSQL wants $1, $2...;
//     the connection rewrites them (rebind), so no query has two spellings;
//   - the schema: the same migrations, with SQLite's storage classes
//     spelled as PostgreSQL types (INTEGER is 64-bit there: BIGINT; BLOB:
//     BYTEA), applied under an advisory lock and recorded one version a
//     row in schema_migrations;
//   - isolation: SQLite runs one write transaction at a time; PostgreSQL
//     runs every transaction SERIALIZABLE, so each read-then-write step
//     (a quota reservation, the next generation, a head's compare and
//     swap) behaves as if the transactions ran one at a time, and a
//     transaction PostgreSQL aborts to keep that is run again (Store.tx).
//     Three hot paths run READ COMMITTED instead (lockingTxOpts) and lock
//     the rows they decide on, so concurrent callers wait for a row rather
//     than abort each other: Place (the sandbox's and the chosen node's
//     rows: placement.go), the admissions (the owner's row: AdmitCreate,
//     AdmitVolume) and the operation leases (one statement each:
//     oplease.go).

// IsPostgresURL reports whether db names a PostgreSQL database (a
// postgres:// or postgresql:// URL) rather than a SQLite file.
func IsPostgresURL(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// Open opens the manager's database: PostgreSQL for a postgres:// URL,
// else the SQLite file at db.
func Open(ctx context.Context, db string, now func() time.Time) (*Store, error) {
	if IsPostgresURL(db) {
		return OpenPostgres(ctx, db, now)
	}
	return OpenStore(ctx, db, now)
}

// pgMaxConns bounds one Store's connections: each manager process holds at
// most this many of the server's max_connections (100 by default).
const pgMaxConns = 10

// pgMigrationLock is the advisory lock key migrations hold: managers that
// start together migrate one after the other.
const pgMigrationLock = 0x63746c6d // "ctlm"

// pgIdleInTxTimeout ends a session idle inside a transaction: none of the
// store's transactions waits on anything but the database.
const pgIdleInTxTimeout = 10 * time.Second

var pgDialect = dialect{
	name:          "postgres",
	migrate:       migratePostgres,
	version:       postgresVersion,
	txOpts:        &sql.TxOptions{Isolation: sql.LevelSerializable},
	lockingTxOpts: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
	forUpdate:     " FOR NO KEY UPDATE",
	skipLocked:    " FOR NO KEY UPDATE SKIP LOCKED",
	retryable:     serializationFailure,
	classify:      pgLost,
}

// OpenPostgres opens the PostgreSQL database at dsn (a postgres:// URL)
// and migrates it. now is the clock for recorded times; nil means time.Now.
func OpenPostgres(ctx context.Context, dsn string, now func() time.Time) (*Store, error) {
	if now == nil {
		now = time.Now
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's message may quote the URL, password included.
		return nil, fmt.Errorf("open database %s: parse the URL: %w", RedactDSN(dsn), errors.New(redactErr(err, dsn)))
	}
	// A client stopped inside a transaction (SIGSTOP, a frozen VM) holds
	// its row locks for ever, and a heartbeat's lock blocks the sweep that
	// would mark that very node lost: the server ends such a session (the
	// URL may set its own).
	if _, ok := cfg.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
		cfg.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.Itoa(int(pgIdleInTxTimeout / time.Millisecond))
	}
	db := sql.OpenDB(pgConnector{stdlib.GetConnector(*cfg)})
	db.SetMaxOpenConns(pgMaxConns)
	db.SetMaxIdleConns(pgMaxConns)
	s := &Store{db: db, now: now, dialect: pgDialect}
	if err := s.dialect.migrate(ctx, s); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database %s: %w", RedactDSN(dsn), err)
	}
	return s, nil
}

// RedactDSN is dsn without its password, for messages and logs.
func RedactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	return u.Redacted()
}

func redactErr(err error, dsn string) string {
	msg := err.Error()
	if u, perr := url.Parse(dsn); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// pgUnavailable marks the error of a database that cannot be reached
// (down, restarting, out of connections, the connection lost) as
// unavailable with a retry hint, which the API answers as 503 with
// Retry-After; other errors pass as they are. driver.ErrBadConn passes too:
// database/sql retries it on a fresh connection.
func pgUnavailable(err error) error {
	if err == nil || errors.Is(err, driver.ErrBadConn) || errdefs.CodeOf(err) == errdefs.CodeUnavailable || !connectionLost(err) {
		return err
	}
	return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: "database unavailable: " + err.Error(), RetryAfter: time.Second,
		Cause: fmt.Errorf("%w: %w", ErrDatabaseLost, err)}
}

// pgLost is pgUnavailable at the store's edge, where a bad connection
// is a lost one too: database/sql retried it and gave up.
func pgLost(err error) error {
	if errors.Is(err, driver.ErrBadConn) && errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: "database unavailable: " + err.Error(), RetryAfter: time.Second,
			Cause: fmt.Errorf("%w: %w", ErrDatabaseLost, err)}
	}
	return pgUnavailable(err)
}

// ErrDatabaseLost is in the chain of an error of a database that could
// not be reached: what failed on it is not refused, only interrupted.
var ErrDatabaseLost = errors.New("database connection lost")

func connectionLost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P01-03: the server is
		// shutting down or starting; 53300: too many connections.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03" || pe.Code == "53300"
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	// SafeToRetry: pgx did not send the request (a connection found
	// closed, as after a restart of the server: "conn closed").
	// ErrConnClosed: the connection closed by a failure earlier in the
	// same operation (a BEGIN after the server restarted answers "failed
	// to deallocate cached statement(s): conn closed", not safe to retry).
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || pgconn.SafeToRetry(err)
}

func serializationFailure(err error) bool {
	var pe *pgconn.PgError
	// 40001 serialization_failure, 40P01 deadlock_detected: both abort
	// the whole transaction and say that a rerun may succeed.
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

var (
	sqliteSerial  = regexp.MustCompile(`\bINTEGER PRIMARY KEY AUTOINCREMENT\b`)
	sqliteInteger = regexp.MustCompile(`\bINTEGER\b`)
	sqliteBlob    = regexp.MustCompile(`\bBLOB\b`)
)

// pgDDL spells a SQLite migration for PostgreSQL. The migrations use only
// TEXT, INTEGER and BLOB columns (times are RFC 3339 text, flags 0/1), so
// the two spellings keep one schema and one set of queries. A SQLite
// AUTOINCREMENT key is an identity column (rows are read back with
// RETURNING, not LastInsertId, which pgx does not answer).
func pgDDL(m string) string {
	m = sqliteSerial.ReplaceAllString(m, "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
	return sqliteBlob.ReplaceAllString(sqliteInteger.ReplaceAllString(m, "BIGINT"), "BYTEA")
}

func migratePostgres(ctx context.Context, s *Store) error {
	// READ COMMITTED, not the stores' SERIALIZABLE: a manager that waited
	// for the lock must see the versions the one before it recorded.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	if err := migratePostgresTx(ctx, tx, s.now()); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit migration: %w", err)
	}
	return nil
}

func migratePostgresTx(ctx context.Context, tx *sql.Tx, now time.Time) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, pgMigrationLock); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		applied_at TEXT NOT NULL
	)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	v, err := postgresVersion(ctx, tx)
	if err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("check schema version: database is version %d, this binary knows %d", v, len(migrations))
	}
	for i := v; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, pgDDL(migrations[i])); err != nil {
			return fmt.Errorf("apply migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, i+1, ts(now)); err != nil {
			return fmt.Errorf("record migration %d: %w", i+1, err)
		}
	}
	return nil
}

func postgresVersion(ctx context.Context, q querier) (int, error) {
	var v int
	if err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// pgConnector hands out connections that speak the shared SQL.
type pgConnector struct{ driver.Connector }

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, pgUnavailable(fmt.Errorf("connect to the database: %w", err))
	}
	sc, ok := conn.(*stdlib.Conn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("connect: pgx returned a %T", conn)
	}
	return pgConn{sc}, nil
}

// pgConn is a pgx connection that rewrites placeholders (rebind) and
// passes Go bools as the schema's 0/1 integers.
type pgConn struct{ *stdlib.Conn }

func (c pgConn) Prepare(query string) (driver.Stmt, error) {
	st, err := c.Conn.Prepare(rebind(query))
	return st, pgUnavailable(err)
}

func (c pgConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.PrepareContext(ctx, rebind(query))
	return st, pgUnavailable(err)
}

func (c pgConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.ExecContext(ctx, rebind(query), args)
	return res, pgUnavailable(err)
}

func (c pgConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.QueryContext(ctx, rebind(query), args)
	return rows, pgUnavailable(err)
}

func (c pgConn) CheckNamedValue(nv *driver.NamedValue) error {
	if b, ok := nv.Value.(bool); ok {
		nv.Value = int64(0)
		if b {
			nv.Value = int64(1)
		}
	}
	return c.Conn.CheckNamedValue(nv)
}

// rebind numbers the ? placeholders of a query ($1, $2, ...); a ? inside
// a quoted string or identifier, or a -- comment, stays as it is.
func rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	for i := 0; i < len(q); i++ {
		switch c := q[i]; {
		case c == '\'' || c == '"':
			// A doubled quote inside ('it''s') ends one run and starts
			// the next: the pair is copied either way.
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+2])
			i += j + 1
		case c == '-' && strings.HasPrefix(q[i:], "--"):
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j])
			i += j - 1
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
