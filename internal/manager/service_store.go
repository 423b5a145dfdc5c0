package manager

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
)

// The service's records (ctl-manager serve). Every object the service
// hands out belongs to an owner; the quota of an owner is checked and its
// share reserved in the same transaction that records the create, so
// concurrent creates can never claim beyond it.

const serviceMigration = `CREATE TABLE owners (
		name                TEXT PRIMARY KEY,
		created_at          TEXT NOT NULL,
		max_sandboxes       INTEGER NOT NULL,
		max_cpu_millis      INTEGER NOT NULL,
		max_memory_bytes    INTEGER NOT NULL,
		max_disk_bytes      INTEGER NOT NULL,
		max_creates_per_min INTEGER NOT NULL
	);
	CREATE TABLE api_keys (
		key_id     TEXT PRIMARY KEY,
		owner      TEXT NOT NULL REFERENCES owners(name),
		hash       BLOB NOT NULL,
		created_at TEXT NOT NULL,
		revoked_at TEXT
	);
	CREATE TABLE owned_sandboxes (
		id           TEXT PRIMARY KEY,
		owner        TEXT NOT NULL REFERENCES owners(name),
		spec         TEXT NOT NULL,
		labels       TEXT NOT NULL DEFAULT '{}',
		cpu_millis   INTEGER NOT NULL,
		memory_bytes INTEGER NOT NULL,
		disk_bytes   INTEGER NOT NULL,
		active       INTEGER NOT NULL CHECK (active IN (0, 1)),
		paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
		reason       TEXT NOT NULL DEFAULT '',
		created_at   TEXT NOT NULL,
		ended_at     TEXT
	);
	CREATE INDEX owned_sandboxes_by_owner ON owned_sandboxes(owner, id);
	CREATE TABLE create_log (
		owner TEXT NOT NULL,
		at    TEXT NOT NULL
	);
	CREATE INDEX create_log_by_owner ON create_log(owner, at);
	CREATE TABLE idempotency (
		owner        TEXT NOT NULL,
		key          TEXT NOT NULL,
		state        TEXT NOT NULL CHECK (state IN ('pending', 'done')),
		request_hash TEXT NOT NULL DEFAULT '',
		status       INTEGER NOT NULL DEFAULT 0,
		content_type TEXT NOT NULL DEFAULT '',
		body         BLOB,
		created_at   TEXT NOT NULL,
		PRIMARY KEY (owner, key)
	);
	CREATE TABLE timers (
		sandbox_id   TEXT NOT NULL REFERENCES owned_sandboxes(id),
		kind         TEXT NOT NULL CHECK (kind IN ('timeout')),
		deadline     TEXT NOT NULL,
		state        TEXT NOT NULL CHECK (state IN ('armed', 'firing', 'done', 'cancelled')),
		operation_id TEXT NOT NULL DEFAULT '',
		fired_at     TEXT,
		finished_at  TEXT,
		attempts     INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (sandbox_id, kind)
	);
	CREATE INDEX timers_due ON timers(state, deadline);`

// ServiceStore is what the service keeps in the manager's database. The
// SQLite Store implements it; a PostgreSQL backend (the fleet) implements
// the same contract.
type ServiceStore interface {
	// SeeIdleEgress: egress counts as idle activity (usage.go).
	SeeIdleEgress(ctx context.Context, id string, total uint64) (bool, error)
	CreateOwner(ctx context.Context, name string) (Owner, error)
	Owner(ctx context.Context, name string) (Owner, error)
	SetQuota(ctx context.Context, owner string, q Quota) (Owner, error)
	Usage(ctx context.Context, owner string) (Usage, error)

	CreateKey(ctx context.Context, owner string) (key string, rec KeyRecord, err error)
	Keys(ctx context.Context, owner string) ([]KeyRecord, error)
	RevokeKey(ctx context.Context, keyID string) error
	Authenticate(ctx context.Context, key string) (owner string, err error)

	AdmitCreate(ctx context.Context, in Admission) error
	OwnedSandbox(ctx context.Context, owner, id string) (OwnedSandbox, error)
	OwnedSandboxes(ctx context.Context, owner, after string, limit int) ([]OwnedSandbox, error)
	UnsettledCreates(ctx context.Context) ([]OwnedSandbox, error)
	EndOwnedSandbox(ctx context.Context, id, reason string) error
	FailCreate(ctx context.Context, id, opErr, reason string) error
	SetPaused(ctx context.Context, id string, paused bool) error

	AdmitVolume(ctx context.Context, in VolumeAdmission) error
	SettleVolume(ctx context.Context, id string, ok bool, reason string) error
	OwnedVolume(ctx context.Context, owner, id string) (OwnedVolume, error)
	OwnedVolumes(ctx context.Context, owner, after string, limit int) ([]OwnedVolume, error)
	BeginVolumeDelete(ctx context.Context, owner, id string) (OwnedVolume, error)
	FinishVolumeDelete(ctx context.Context, id string) error
	UnsettledVolumes(ctx context.Context) ([]OwnedVolume, error)

	AppendEvent(ctx context.Context, ev ServiceEvent) (ServiceEvent, error)
	Events(ctx context.Context, owner, sandbox string, after int64, limit int) ([]ServiceEvent, error)
	PruneEvents(ctx context.Context, before time.Time) (int, error)

	BeginIdempotent(ctx context.Context, owner, key string) (IdempotencyRecord, bool, error)
	FinishIdempotent(ctx context.Context, owner, key string, rec IdempotencyRecord) error
	AbandonIdempotent(ctx context.Context, owner, key string) error
	AbandonPendingIdempotent(ctx context.Context) (int, error)
	PruneIdempotent(ctx context.Context, before time.Time) (int, error)

	ExtendTimer(ctx context.Context, id string, deadline time.Time) (time.Time, error)
	DueTimers(ctx context.Context, now time.Time, limit int) ([]Timer, error)
	MarkFiring(ctx context.Context, id string) (Timer, bool, error)
	TouchIdle(ctx context.Context, owner, id string, now time.Time) error
	RearmIdle(ctx context.Context, id string, now time.Time) error
	DueIdle(ctx context.Context, now time.Time, limit int) ([]IdleTimer, error)
	MarkIdleFiring(ctx context.Context, id string) (IdleTimer, bool, error)
	FinishIdle(ctx context.Context, id, action, opID string, end bool) error
	IdleTimer(ctx context.Context, id string) (IdleTimer, error)
	FinishTimer(ctx context.Context, id, opID string, end bool) error
	Timer(ctx context.Context, id string) (Timer, error)

	LeaseStore
	ExitStore
}

var _ ServiceStore = (*Store)(nil)

// Quota is what an owner may hold at once (and create per minute).
type Quota struct {
	Sandboxes     int64 `json:"sandboxes"`
	CPUMillis     int64 `json:"cpu_millis"`
	MemoryBytes   int64 `json:"memory_bytes"`
	DiskBytes     int64 `json:"disk_bytes"`
	CreatesPerMin int64 `json:"creates_per_min"`
}

// DefaultQuota is a new owner's quota until `owner quota set` changes it.
var DefaultQuota = Quota{Sandboxes: 10, CPUMillis: 8000, MemoryBytes: 16 << 30, DiskBytes: 100 << 30, CreatesPerMin: 60}

// Usage is what an owner holds now: its active sandboxes' reservations
// and its volumes (created or being created, not deleted), whose sizes
// count in DiskBytes.
type Usage struct {
	Sandboxes   int64 `json:"sandboxes"`
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
	Volumes     int64 `json:"volumes"`
}

// Owner is a tenant: a team whose keys see only its objects.
type Owner struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	Quota     Quota     `json:"quota"`
}

// KeyRecord is an API key as stored: never the key, only its id and hash.
type KeyRecord struct {
	KeyID     string     `json:"key_id"`
	Owner     string     `json:"owner"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// QuotaError is a create refused by the owner's quota: nothing was
// claimed. RetryAfter is set for the create rate.
type QuotaError struct {
	Owner      string
	Resource   string
	Limit      int64
	Used       int64
	Asked      int64
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("quota of owner %s exceeded: %s: using %d of %d, asked for %d more", e.Owner, e.Resource, e.Used, e.Limit, e.Asked)
}

// ErrUnauthenticated is a missing, malformed, unknown or revoked key.
var ErrUnauthenticated = errors.New("unknown or revoked API key")

// API keys: "ctl_" + base64url(32 random bytes). The first keyIDLen
// characters after the prefix are the key id, stored in clear to find the
// record; the whole key is compared by its SHA-256 in constant time.
const (
	keyPrefix = "ctl_"
	keyIDLen  = 12
)

// Owner names are the names of sandbox ids: short, safe in paths and logs.
func checkOwner(name string) error { return names.CheckID("owner", name) }

// CreateOwner records an owner with the default quota; an existing owner
// is returned as it is.
func (s *Store) CreateOwner(ctx context.Context, name string) (Owner, error) {
	if err := checkOwner(name); err != nil {
		return Owner{}, err
	}
	var o Owner
	err := s.tx(ctx, func(tx *sql.Tx) error {
		q := DefaultQuota
		if _, err := tx.ExecContext(ctx, `INSERT INTO owners (name, created_at, max_sandboxes, max_cpu_millis, max_memory_bytes, max_disk_bytes, max_creates_per_min)
			VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`,
			name, ts(s.now()), q.Sandboxes, q.CPUMillis, q.MemoryBytes, q.DiskBytes, q.CreatesPerMin); err != nil {
			return fmt.Errorf("record owner %s: %w", name, err)
		}
		var err error
		o, err = ownerTx(ctx, tx, name)
		return err
	})
	return o, err
}

func ownerTx(ctx context.Context, q querier, name string) (Owner, error) {
	return ownerLockTx(ctx, q, name, "")
}

// ownerLockTx is ownerTx ending its SELECT with lock (the dialect's
// forUpdate): admissions, which check the owner's usage against its quota
// and then add to it, hold the owner's row, so they run one after the
// other per owner, each reading what the one before committed
// (READ COMMITTED on PostgreSQL: lockingTxOpts). Without it, concurrent
// creates of one owner kept aborting each other as serialization
// failures under load.
func ownerLockTx(ctx context.Context, q querier, name, lock string) (Owner, error) {
	var o Owner
	var created string
	err := q.QueryRowContext(ctx, `SELECT name, created_at, max_sandboxes, max_cpu_millis, max_memory_bytes, max_disk_bytes, max_creates_per_min FROM owners WHERE name = ?`+lock, name).
		Scan(&o.Name, &created, &o.Quota.Sandboxes, &o.Quota.CPUMillis, &o.Quota.MemoryBytes, &o.Quota.DiskBytes, &o.Quota.CreatesPerMin)
	if errors.Is(err, sql.ErrNoRows) {
		return o, notFound("owner %s not known", name)
	}
	if err != nil {
		return o, fmt.Errorf("read owner %s: %w", name, err)
	}
	o.CreatedAt, err = parseTS(created)
	return o, err
}

// Owner returns an owner.
func (s *Store) Owner(ctx context.Context, name string) (Owner, error) {
	return ownerTx(ctx, s.db, name)
}

// SetQuota replaces an owner's quota (creating the owner if needed). A
// lower quota does not evict what the owner holds; it refuses creates
// until the owner is back under it.
func (s *Store) SetQuota(ctx context.Context, owner string, q Quota) (Owner, error) {
	if q.Sandboxes < 0 || q.CPUMillis < 0 || q.MemoryBytes < 0 || q.DiskBytes < 0 || q.CreatesPerMin < 0 {
		return Owner{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "quota of %s: limits must not be negative", owner)
	}
	if _, err := s.CreateOwner(ctx, owner); err != nil {
		return Owner{}, err
	}
	var o Owner
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE owners SET max_sandboxes = ?, max_cpu_millis = ?, max_memory_bytes = ?, max_disk_bytes = ?, max_creates_per_min = ? WHERE name = ?`,
			q.Sandboxes, q.CPUMillis, q.MemoryBytes, q.DiskBytes, q.CreatesPerMin, owner); err != nil {
			return fmt.Errorf("set quota of %s: %w", owner, err)
		}
		var err error
		o, err = ownerTx(ctx, tx, owner)
		return err
	})
	return o, err
}

// Usage returns what the owner's active sandboxes reserve.
func (s *Store) Usage(ctx context.Context, owner string) (Usage, error) {
	return usageTx(ctx, s.db, owner)
}

func usageTx(ctx context.Context, q querier, owner string) (Usage, error) {
	var u Usage
	err := q.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(cpu_millis), 0), COALESCE(SUM(memory_bytes), 0), COALESCE(SUM(disk_bytes), 0)
		FROM owned_sandboxes WHERE owner = ? AND active = 1`, owner).Scan(&u.Sandboxes, &u.CPUMillis, &u.MemoryBytes, &u.DiskBytes)
	if err != nil {
		return u, fmt.Errorf("read usage of %s: %w", owner, err)
	}
	var volBytes int64
	err = q.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM owned_volumes WHERE owner = ? AND state IN ('creating', 'ready', 'deleting')`, owner).
		Scan(&u.Volumes, &volBytes)
	if err != nil {
		return u, fmt.Errorf("read volume usage of %s: %w", owner, err)
	}
	u.DiskBytes += volBytes
	return u, nil
}

func hashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// CreateKey makes a new key for owner (which must exist) and returns it:
// the only time it is seen; the store keeps its hash.
func (s *Store) CreateKey(ctx context.Context, owner string) (string, KeyRecord, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", KeyRecord{}, fmt.Errorf("generate key: %w", err)
	}
	key := keyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	rec := KeyRecord{KeyID: key[len(keyPrefix) : len(keyPrefix)+keyIDLen], Owner: owner, CreatedAt: s.now().UTC()}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := ownerTx(ctx, tx, owner); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO api_keys (key_id, owner, hash, created_at) VALUES (?, ?, ?, ?)`,
			rec.KeyID, owner, hashKey(key), ts(rec.CreatedAt)); err != nil {
			return fmt.Errorf("record key of %s: %w", owner, err)
		}
		return nil
	})
	if err != nil {
		return "", KeyRecord{}, err
	}
	return key, rec, nil
}

// Keys lists the keys of owner ("" for all).
func (s *Store) Keys(ctx context.Context, owner string) ([]KeyRecord, error) {
	out, err := collect(ctx, s.db, scanKey, `SELECT key_id, owner, created_at, revoked_at FROM api_keys WHERE ? = '' OR owner = ? ORDER BY owner, created_at, key_id`, owner, owner)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	if out == nil {
		out = []KeyRecord{}
	}
	return out, nil
}

func scanKey(row rowScanner) (KeyRecord, error) {
	var r KeyRecord
	var created string
	var revoked sql.NullString
	if err := row.Scan(&r.KeyID, &r.Owner, &created, &revoked); err != nil {
		return r, fmt.Errorf("read key: %w", err)
	}
	var err error
	if r.CreatedAt, err = parseTS(created); err != nil {
		return r, err
	}
	r.RevokedAt, err = parseNullTS(revoked)
	return r, err
}

// RevokeKey revokes a key by its id; revoking twice is success.
func (s *Store) RevokeKey(ctx context.Context, keyID string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE key_id = ?`, ts(s.now()), keyID)
		if err != nil {
			return fmt.Errorf("revoke key %s: %w", keyID, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return errors.Join(err, notFound("key %s not known", errdefs.Quote(keyID)))
		}
		return nil
	})
}

// Authenticate returns the owner of a valid, unrevoked key, or
// ErrUnauthenticated.
func (s *Store) Authenticate(ctx context.Context, key string) (string, error) {
	if !strings.HasPrefix(key, keyPrefix) || len(key) != len(keyPrefix)+43 {
		return "", ErrUnauthenticated
	}
	var owner string
	var hash []byte
	var revoked sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT owner, hash, revoked_at FROM api_keys WHERE key_id = ?`, key[len(keyPrefix):len(keyPrefix)+keyIDLen]).
		Scan(&owner, &hash, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrUnauthenticated
	}
	if err != nil {
		return "", fmt.Errorf("look up key: %w", err)
	}
	if subtle.ConstantTimeCompare(hash, hashKey(key)) != 1 || revoked.Valid {
		return "", ErrUnauthenticated
	}
	return owner, nil
}

// Admission is a create as the service records it before the claim.
type Admission struct {
	Owner     string
	ID        string
	Spec      json.RawMessage // the service's request, as the sandbox's record
	Labels    map[string]string
	CPUMillis int64
	Memory    int64
	Disk      int64
	// Deadline, when not zero, arms the sandbox's timeout timer.
	Deadline time.Time
	// Idle, when not zero, arms the sandbox's idle timer: it fires Idle
	// after the last activity (TouchIdle).
	Idle time.Duration
	// Volumes are the owner's volumes the sandbox holds until it ends.
	Volumes []string
	// Lease, when set, is the create's operation lease, taken for
	// LeaseTTL in the admission's transaction (TakeLease's rules): the
	// create is admitted only with its lease, in one write. Held live by
	// another holder, it refuses the admission (unavailable).
	Lease    *OpLease
	LeaseTTL time.Duration
}

// AdmitCreate checks owner's quota and create rate and, in the same
// transaction, records the sandbox as the owner's (reserving its share),
// the create in the rate log, its timeout timer and its operation lease.
// Over quota it records nothing and returns a *QuotaError.
func (s *Store) AdmitCreate(ctx context.Context, in Admission) error {
	if l := in.Lease; l != nil && (l.ID == "" || l.Holder == "" || in.LeaseTTL <= 0) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "an operation lease needs an id, a holder and a positive TTL")
	}
	labels, err := json.Marshal(in.Labels)
	if err != nil {
		return fmt.Errorf("encode labels: %w", err)
	}
	if in.Labels == nil {
		labels = []byte("{}")
	}
	return s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) error {
		o, err := ownerLockTx(ctx, tx, in.Owner, s.dialect.forUpdate)
		if err != nil {
			return err
		}
		now := s.now()
		var recent int64
		var oldest sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), MIN(at) FROM create_log WHERE owner = ? AND at > ?`, in.Owner, ts(now.Add(-time.Minute))).Scan(&recent, &oldest); err != nil {
			return fmt.Errorf("read create rate of %s: %w", in.Owner, err)
		}
		if recent+1 > o.Quota.CreatesPerMin {
			qe := &QuotaError{Owner: in.Owner, Resource: "creates per minute", Limit: o.Quota.CreatesPerMin, Used: recent, Asked: 1, RetryAfter: time.Second}
			if t, err := parseNullTS(oldest); err == nil && t != nil {
				qe.RetryAfter = max(time.Second, t.Add(time.Minute).Sub(now).Round(time.Second))
			}
			return qe
		}
		u, err := usageTx(ctx, tx, in.Owner)
		if err != nil {
			return err
		}
		for _, c := range []struct {
			what              string
			used, asked, limt int64
		}{
			{"sandboxes", u.Sandboxes, 1, o.Quota.Sandboxes},
			{"cpu_millis", u.CPUMillis, in.CPUMillis, o.Quota.CPUMillis},
			{"memory_bytes", u.MemoryBytes, in.Memory, o.Quota.MemoryBytes},
			{"disk_bytes", u.DiskBytes, in.Disk, o.Quota.DiskBytes},
		} {
			if c.used+c.asked > c.limt {
				return &QuotaError{Owner: in.Owner, Resource: c.what, Limit: c.limt, Used: c.used, Asked: c.asked}
			}
		}
		if in.Lease != nil {
			cur, ok, err := takeLeaseTx(ctx, tx, *in.Lease, in.LeaseTTL, now)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: %w", ErrLeaseHeld, errdefs.Busy(time.Second, "operation %s is running on replica %s; retry", cur.ID, cur.Holder))
			}
		}
		// The log only needs the last minute: older entries go here.
		if _, err := tx.ExecContext(ctx, `DELETE FROM create_log WHERE owner = ? AND at <= ?`, in.Owner, ts(now.Add(-time.Minute))); err != nil {
			return fmt.Errorf("trim create log: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO create_log (owner, at) VALUES (?, ?)`, in.Owner, ts(now)); err != nil {
			return fmt.Errorf("log create: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO owned_sandboxes (id, owner, spec, labels, cpu_millis, memory_bytes, disk_bytes, active, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)`,
			in.ID, in.Owner, string(in.Spec), string(labels), in.CPUMillis, in.Memory, in.Disk, ts(now)); err != nil {
			return fmt.Errorf("record sandbox %s of %s: %w", in.ID, in.Owner, err)
		}
		if err := holdVolumesTx(ctx, tx, in.Owner, in.ID, in.Volumes); err != nil {
			return err
		}
		if !in.Deadline.IsZero() {
			if _, err := tx.ExecContext(ctx, `INSERT INTO timers (sandbox_id, kind, deadline, state) VALUES (?, 'timeout', ?, 'armed')`, in.ID, ts(in.Deadline)); err != nil {
				return fmt.Errorf("arm timeout of %s: %w", in.ID, err)
			}
		}
		if in.Idle > 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO idle_timers (sandbox_id, idle_ms, deadline, state) VALUES (?, ?, ?, 'armed')`,
				in.ID, in.Idle.Milliseconds(), ts(now.Add(in.Idle))); err != nil {
				return fmt.Errorf("arm idle timer of %s: %w", in.ID, err)
			}
		}
		return nil
	})
}

// OwnedSandbox is a sandbox of an owner: the service's record joined with
// the manager's (State and Generation are the manager's; empty before the
// claim is recorded).
type OwnedSandbox struct {
	ID        string            `json:"id"`
	Owner     string            `json:"owner"`
	Spec      json.RawMessage   `json:"spec"`
	Labels    map[string]string `json:"labels"`
	Active    bool              `json:"active"`
	Paused    bool              `json:"paused"`
	Reason    string            `json:"reason,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	EndedAt   *time.Time        `json:"ended_at,omitempty"`
	State     string            `json:"state"`
	// StateReason is why the generation failed or was lost, as the
	// manager recorded it (its words, not the caller's: Reason is those).
	StateReason string `json:"state_reason,omitempty"`
	Generation  uint64 `json:"generation"`
	// Deadline is the armed timeout (nil: none or already fired).
	Deadline   *time.Time `json:"deadline,omitempty"`
	TimerState string     `json:"timer_state,omitempty"`
	// Exit is how its workload ended (nil: it did not, or not yet seen).
	Exit *SandboxExit `json:"exit,omitempty"`
}

const ownedSelect = `SELECT o.id, o.owner, o.spec, o.labels, o.active, o.paused, o.reason, o.created_at, o.ended_at,
	COALESCE(s.state, ''), COALESCE(s.reason, ''), COALESCE(s.generation, 0), t.deadline, COALESCE(t.state, ''), o.exit, o.exit_generation
	FROM owned_sandboxes o
	LEFT JOIN sandboxes s ON s.id = o.id
	LEFT JOIN timers t ON t.sandbox_id = o.id AND t.kind = 'timeout'`

func scanOwned(row rowScanner) (OwnedSandbox, error) {
	var r OwnedSandbox
	var spec, labels, created string
	var ended, deadline sql.NullString
	var exit string
	var exitGen uint64
	if err := row.Scan(&r.ID, &r.Owner, &spec, &labels, &r.Active, &r.Paused, &r.Reason, &created, &ended, &r.State, &r.StateReason, &r.Generation, &deadline, &r.TimerState, &exit, &exitGen); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return r, notFound("sandbox not found")
		}
		return r, fmt.Errorf("read sandbox: %w", err)
	}
	r.Spec = json.RawMessage(spec)
	if err := json.Unmarshal([]byte(labels), &r.Labels); err != nil {
		return r, fmt.Errorf("decode labels of %s: %w", r.ID, err)
	}
	var err error
	if r.CreatedAt, err = parseTS(created); err != nil {
		return r, err
	}
	if r.EndedAt, err = parseNullTS(ended); err != nil {
		return r, err
	}
	if r.Exit, err = exitOf(exit, exitGen, r.Generation); err != nil {
		return r, fmt.Errorf("sandbox %s: %w", r.ID, err)
	}
	if r.TimerState == "armed" || r.TimerState == "firing" {
		r.Deadline, err = parseNullTS(deadline)
	}
	return r, err
}

// OwnedSandbox returns owner's sandbox id; another owner's is not_found,
// exactly like a missing one.
func (s *Store) OwnedSandbox(ctx context.Context, owner, id string) (OwnedSandbox, error) {
	r, err := scanOwned(s.db.QueryRowContext(ctx, ownedSelect+` WHERE o.id = ? AND o.owner = ?`, id, owner))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return r, notFound("sandbox %s not found", errdefs.Quote(id))
	}
	return r, err
}

// OwnedSandboxes returns up to limit of owner's sandboxes with ids after
// after, in id order.
func (s *Store) OwnedSandboxes(ctx context.Context, owner, after string, limit int) ([]OwnedSandbox, error) {
	out, err := collect(ctx, s.db, scanOwned, ownedSelect+` WHERE o.owner = ? AND o.id > ? ORDER BY o.id LIMIT ?`, owner, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of %s: %w", owner, err)
	}
	return out, nil
}

// EndOwnedSandbox returns a sandbox's reservation to its owner's quota
// (released, or its create failed for good) and cancels its armed timers.
// Ending an ended sandbox changes nothing.
// The reason is required (service_fail.go).
func (s *Store) EndOwnedSandbox(ctx context.Context, id, reason string) error {
	if reason == "" {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "end sandbox %s: no reason given", id)
	}
	return s.tx(ctx, func(tx *sql.Tx) error { return endOwnedTx(ctx, tx, id, reason, ts(s.now())) })
}

func endOwnedTx(ctx context.Context, tx *sql.Tx, id, reason, now string) error {
	if _, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET active = 0, reason = CASE WHEN reason = '' THEN ? ELSE reason END, ended_at = ? WHERE id = ? AND active = 1`,
		reason, now, id); err != nil {
		return fmt.Errorf("end sandbox %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE timers SET state = 'cancelled', finished_at = ? WHERE sandbox_id = ? AND state = 'armed'`, now, id); err != nil {
		return fmt.Errorf("cancel timers of %s: %w", id, err)
	}
	return nil
}

// SetPaused records whether the sandbox is paused (its head published,
// no generation running).
func (s *Store) SetPaused(ctx context.Context, id string, paused bool) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET paused = ? WHERE id = ?`, paused, id); err != nil {
			return fmt.Errorf("record pause of %s: %w", id, err)
		}
		return nil
	})
}

// IdempotencyRecord is the first answer to a mutating call with an
// Idempotency-Key, replayed to every retry with the same key and request.
type IdempotencyRecord struct {
	State       string `json:"state"` // "pending" while the first call runs
	RequestHash string `json:"request_hash"`
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	Body        []byte `json:"body"`
}

// BeginIdempotent claims (owner, key) for a first call: created=true and
// a pending record, or created=false and the record already there.
func (s *Store) BeginIdempotent(ctx context.Context, owner, key string) (IdempotencyRecord, bool, error) {
	var rec IdempotencyRecord
	var created bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO idempotency (owner, key, state, created_at) VALUES (?, ?, 'pending', ?) ON CONFLICT (owner, key) DO NOTHING`,
			owner, key, ts(s.now()))
		if err != nil {
			return fmt.Errorf("record idempotency key: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("record idempotency key: %w", err)
		}
		created = n == 1
		err = tx.QueryRowContext(ctx, `SELECT state, request_hash, status, content_type, body FROM idempotency WHERE owner = ? AND key = ?`, owner, key).
			Scan(&rec.State, &rec.RequestHash, &rec.Status, &rec.ContentType, &rec.Body)
		if err != nil {
			return fmt.Errorf("read idempotency record: %w", err)
		}
		return nil
	})
	return rec, created, err
}

// FinishIdempotent stores the first answer.
func (s *Store) FinishIdempotent(ctx context.Context, owner, key string, rec IdempotencyRecord) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE idempotency SET state = 'done', request_hash = ?, status = ?, content_type = ?, body = ? WHERE owner = ? AND key = ?`,
			rec.RequestHash, rec.Status, rec.ContentType, rec.Body, owner, key); err != nil {
			return fmt.Errorf("record idempotent answer: %w", err)
		}
		return nil
	})
}

// AbandonIdempotent forgets a pending key (the call's answer is not one to
// replay: a retry runs it again).
func (s *Store) AbandonIdempotent(ctx context.Context, owner, key string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE owner = ? AND key = ? AND state = 'pending'`, owner, key); err != nil {
			return fmt.Errorf("forget idempotency key: %w", err)
		}
		return nil
	})
}

// AbandonPendingIdempotent forgets every pending key: called when the one
// server of this database starts, since the calls that held them died
// with the previous process.
func (s *Store) AbandonPendingIdempotent(ctx context.Context) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE state = 'pending'`)
		if err != nil {
			return fmt.Errorf("forget pending idempotency keys: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// Timer is a sandbox's journaled timeout.
type Timer struct {
	SandboxID   string    `json:"sandbox_id"`
	Owner       string    `json:"owner"`
	Deadline    time.Time `json:"deadline"`
	State       string    `json:"state"`
	OperationID string    `json:"operation_id,omitempty"`
	Attempts    int       `json:"attempts"`
}

// ExtendTimer moves an armed timeout to deadline; a timer already firing
// (or none) is a conflict.
func (s *Store) ExtendTimer(ctx context.Context, id string, deadline time.Time) (time.Time, error) {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE timers SET deadline = ? WHERE sandbox_id = ? AND kind = 'timeout' AND state = 'armed'`, ts(deadline), id)
		if err != nil {
			return fmt.Errorf("extend timeout of %s: %w", id, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO timers (sandbox_id, kind, deadline, state) SELECT id, 'timeout', ?, 'armed' FROM owned_sandboxes
				WHERE id = ? AND active = 1 AND NOT EXISTS (SELECT 1 FROM timers WHERE sandbox_id = ? AND kind = 'timeout')`, ts(deadline), id, id); err != nil {
				return fmt.Errorf("arm timeout of %s: %w", id, err)
			}
			var state string
			err := tx.QueryRowContext(ctx, `SELECT state FROM timers WHERE sandbox_id = ? AND kind = 'timeout'`, id).Scan(&state)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("read timeout of %s: %w", id, err)
			}
			if state != "armed" {
				return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s is ending (its timeout is %s)", id, cmpOr(state, "absent"))
			}
		}
		return nil
	})
	return deadline, err
}

func cmpOr(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

const timerSelect = `SELECT t.sandbox_id, o.owner, t.deadline, t.state, t.operation_id, t.attempts FROM timers t JOIN owned_sandboxes o ON o.id = t.sandbox_id`

func scanTimer(row rowScanner) (Timer, error) {
	var t Timer
	var deadline string
	if err := row.Scan(&t.SandboxID, &t.Owner, &deadline, &t.State, &t.OperationID, &t.Attempts); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return t, notFound("timer not found")
		}
		return t, fmt.Errorf("read timer: %w", err)
	}
	var err error
	t.Deadline, err = parseTS(deadline)
	return t, err
}

// DueTimers returns armed timers past their deadline and every timer left
// firing (by this process or a previous one), oldest deadline first.
func (s *Store) DueTimers(ctx context.Context, now time.Time, limit int) ([]Timer, error) {
	out, err := collect(ctx, s.db, scanTimer, timerSelect+` WHERE (t.state = 'armed' AND t.deadline <= ?) OR t.state = 'firing' ORDER BY t.deadline LIMIT ?`, ts(now), limit)
	if err != nil {
		return nil, fmt.Errorf("list due timers: %w", err)
	}
	return out, nil
}

// MarkFiring records that a due timer fires, before its release is sent:
// a manager that dies after this finds it firing and completes it. ok is
// false when the timer is no longer armed or firing (extended, cancelled,
// done).
func (s *Store) MarkFiring(ctx context.Context, id string) (Timer, bool, error) {
	var t Timer
	var ok bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE timers SET state = 'firing', fired_at = COALESCE(fired_at, ?), attempts = attempts + 1
			WHERE sandbox_id = ? AND kind = 'timeout' AND (state = 'firing' OR (state = 'armed' AND deadline <= ?))`, ts(s.now()), id, ts(s.now()))
		if err != nil {
			return fmt.Errorf("mark timeout of %s firing: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("mark timeout of %s firing: %w", id, err)
		}
		ok = n == 1
		t, err = scanTimer(tx.QueryRowContext(ctx, timerSelect+` WHERE t.sandbox_id = ? AND t.kind = 'timeout'`, id))
		return err
	})
	return t, ok, err
}

// FinishTimer records that a firing timer's release is done (opID is the
// release operation) and, if end, ends the sandbox's reservation, in one
// transaction (end is false when the cleanup is unproven: the share stays
// taken).
func (s *Store) FinishTimer(ctx context.Context, id, opID string, end bool) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		if _, err := tx.ExecContext(ctx, `UPDATE timers SET state = 'done', operation_id = ?, finished_at = ? WHERE sandbox_id = ? AND kind = 'timeout' AND state = 'firing'`,
			opID, now, id); err != nil {
			return fmt.Errorf("finish timeout of %s: %w", id, err)
		}
		if !end {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE owned_sandboxes SET active = 0, reason = CASE WHEN reason = '' THEN 'timeout' ELSE reason END, ended_at = ? WHERE id = ? AND active = 1`,
			now, id); err != nil {
			return fmt.Errorf("end sandbox %s: %w", id, err)
		}
		return nil
	})
}

// Timer returns a sandbox's timeout timer.
func (s *Store) Timer(ctx context.Context, id string) (Timer, error) {
	return scanTimer(s.db.QueryRowContext(ctx, timerSelect+` WHERE t.sandbox_id = ? AND t.kind = 'timeout'`, id))
}

// UnsettledCreates returns the active sandboxes whose create never
// settled: no claim recorded, or one still pending (its server stopped
// before the answer). A starting server completes them.
func (s *Store) UnsettledCreates(ctx context.Context) ([]OwnedSandbox, error) {
	out, err := collect(ctx, s.db, scanOwned, ownedSelect+` WHERE o.active = 1 AND (s.state IS NULL OR s.state = ?) ORDER BY o.created_at`, "claiming")
	if err != nil {
		return nil, fmt.Errorf("list unsettled creates: %w", err)
	}
	return out, nil
}

// PruneIdempotent forgets the answers kept before before: a retry with a
// key older than that runs as a new call.
func (s *Store) PruneIdempotent(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE state = 'done' AND created_at < ?`, ts(before))
		if err != nil {
			return fmt.Errorf("prune idempotency keys: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}
