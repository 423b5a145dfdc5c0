package manager

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// The service's persistent volumes: each belongs to an owner, its size
// counts against the owner's disk quota from its admission until it is
// deleted, and a sandbox that names it holds it (one active sandbox at a
// time) from its admission until the sandbox ends.

const serviceVolumesMigration = `CREATE TABLE owned_volumes (
		id         TEXT PRIMARY KEY,
		owner      TEXT NOT NULL REFERENCES owners(name),
		size_bytes INTEGER NOT NULL,
		labels     TEXT NOT NULL DEFAULT '{}',
		state      TEXT NOT NULL CHECK (state IN ('creating', 'ready', 'failed', 'deleting', 'deleted')),
		reason     TEXT NOT NULL DEFAULT '',
		created_at TEXT NOT NULL,
		ended_at   TEXT
	);
	CREATE INDEX owned_volumes_by_owner ON owned_volumes(owner, id);
	CREATE TABLE sandbox_volumes (
		sandbox_id TEXT NOT NULL REFERENCES owned_sandboxes(id),
		volume_id  TEXT NOT NULL REFERENCES owned_volumes(id),
		PRIMARY KEY (sandbox_id, volume_id)
	);
	CREATE INDEX sandbox_volumes_by_volume ON sandbox_volumes(volume_id);`

// Volume states as the service records them.
const (
	VolumeCreating = "creating"
	VolumeReady    = "ready"
	VolumeFailed   = "failed"
	VolumeDeleting = "deleting"
	VolumeDeleted  = "deleted"
)

// VolumeAdmission is a volume create as recorded before the block store
// makes it.
type VolumeAdmission struct {
	Owner  string
	ID     string
	Size   int64
	Labels map[string]string
}

// OwnedVolume is a persistent volume of an owner.
type OwnedVolume struct {
	ID        string            `json:"id"`
	Owner     string            `json:"owner"`
	Size      int64             `json:"size_bytes"`
	Labels    map[string]string `json:"labels"`
	State     string            `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	EndedAt   *time.Time        `json:"ended_at,omitempty"`
	// HeldBy is the active sandbox that holds it ("": none).
	HeldBy string `json:"held_by,omitempty"`
}

const volumeSelect = `SELECT v.id, v.owner, v.size_bytes, v.labels, v.state, v.reason, v.created_at, v.ended_at,
	COALESCE((SELECT sv.sandbox_id FROM sandbox_volumes sv JOIN owned_sandboxes o ON o.id = sv.sandbox_id
		WHERE sv.volume_id = v.id AND o.active = 1 ORDER BY o.created_at LIMIT 1), '')
	FROM owned_volumes v`

func scanVolume(row rowScanner) (OwnedVolume, error) {
	var v OwnedVolume
	var labels, created string
	var ended sql.NullString
	if err := row.Scan(&v.ID, &v.Owner, &v.Size, &labels, &v.State, &v.Reason, &created, &ended, &v.HeldBy); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return v, notFound("volume not found")
		}
		return v, fmt.Errorf("read volume: %w", err)
	}
	if err := json.Unmarshal([]byte(labels), &v.Labels); err != nil {
		return v, fmt.Errorf("decode labels of volume %s: %w", v.ID, err)
	}
	var err error
	if v.CreatedAt, err = parseTS(created); err != nil {
		return v, err
	}
	v.EndedAt, err = parseNullTS(ended)
	return v, err
}

func ownedVolumeTx(ctx context.Context, q querier, owner, id string) (OwnedVolume, error) {
	v, err := scanVolume(q.QueryRowContext(ctx, volumeSelect+` WHERE v.id = ? AND v.owner = ?`, id, owner))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return v, notFound("volume %s not found", errdefs.Quote(id))
	}
	return v, err
}

// AdmitVolume checks the owner's disk quota and, in the same transaction,
// records the volume as creating (its size taken from the quota).
func (s *Store) AdmitVolume(ctx context.Context, in VolumeAdmission) error {
	labels := []byte("{}")
	if in.Labels != nil {
		var err error
		if labels, err = json.Marshal(in.Labels); err != nil {
			return fmt.Errorf("encode labels: %w", err)
		}
	}
	// Under the owner's lock, as AdmitCreate: the two add to one quota.
	return s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) error {
		o, err := ownerLockTx(ctx, tx, in.Owner, s.dialect.forUpdate)
		if err != nil {
			return err
		}
		u, err := usageTx(ctx, tx, in.Owner)
		if err != nil {
			return err
		}
		if u.DiskBytes+in.Size > o.Quota.DiskBytes {
			return &QuotaError{Owner: in.Owner, Resource: "disk_bytes", Limit: o.Quota.DiskBytes, Used: u.DiskBytes, Asked: in.Size}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO owned_volumes (id, owner, size_bytes, labels, state, created_at) VALUES (?, ?, ?, ?, 'creating', ?)`,
			in.ID, in.Owner, in.Size, string(labels), ts(s.now())); err != nil {
			return fmt.Errorf("record volume %s of %s: %w", in.ID, in.Owner, err)
		}
		return nil
	})
}

// SettleVolume ends a volume's create: ready, or failed with reason (its
// share of the quota back).
func (s *Store) SettleVolume(ctx context.Context, id string, ok bool, reason string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		q := `UPDATE owned_volumes SET state = 'ready' WHERE id = ? AND state = 'creating'`
		args := []any{id}
		if !ok {
			q = `UPDATE owned_volumes SET state = 'failed', reason = ?, ended_at = ? WHERE id = ? AND state = 'creating'`
			args = []any{reason, ts(s.now()), id}
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("settle volume %s: %w", id, err)
		}
		return nil
	})
}

// OwnedVolume returns owner's volume id; another owner's is not_found,
// exactly like a missing one.
func (s *Store) OwnedVolume(ctx context.Context, owner, id string) (OwnedVolume, error) {
	return ownedVolumeTx(ctx, s.db, owner, id)
}

// OwnedVolumes returns up to limit of owner's volumes with ids after
// after, in id order.
func (s *Store) OwnedVolumes(ctx context.Context, owner, after string, limit int) ([]OwnedVolume, error) {
	out, err := collect(ctx, s.db, scanVolume, volumeSelect+` WHERE v.owner = ? AND v.id > ? ORDER BY v.id LIMIT ?`, owner, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list volumes of %s: %w", owner, err)
	}
	return out, nil
}

// BeginVolumeDelete marks owner's volume deleting, unless an active
// sandbox holds it (conflict); a volume already deleting stays so (a
// repeat), one deleted is returned as it is.
func (s *Store) BeginVolumeDelete(ctx context.Context, owner, id string) (OwnedVolume, error) {
	var v OwnedVolume
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		if v, err = ownedVolumeTx(ctx, tx, owner, id); err != nil {
			return err
		}
		switch {
		case v.State == VolumeDeleted || v.State == VolumeDeleting:
			return nil
		case v.State == VolumeCreating:
			return errdefs.Errorf(errdefs.CodeConflict, "volume %s is being created", id)
		case v.HeldBy != "":
			return errdefs.Errorf(errdefs.CodeConflict, "volume %s is held by sandbox %s; destroy it first", id, v.HeldBy)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE owned_volumes SET state = 'deleting' WHERE id = ?`, id); err != nil {
			return fmt.Errorf("mark volume %s deleting: %w", id, err)
		}
		v.State = VolumeDeleting
		return nil
	})
	return v, err
}

// FinishVolumeDelete records a deleting volume deleted: its share of the
// quota comes back.
func (s *Store) FinishVolumeDelete(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE owned_volumes SET state = 'deleted', ended_at = ? WHERE id = ? AND state = 'deleting'`, ts(s.now()), id); err != nil {
			return fmt.Errorf("finish deleting volume %s: %w", id, err)
		}
		return nil
	})
}

// UnsettledVolumes returns the volumes a previous server left creating or
// deleting; a starting server settles them.
func (s *Store) UnsettledVolumes(ctx context.Context) ([]OwnedVolume, error) {
	out, err := collect(ctx, s.db, scanVolume, volumeSelect+` WHERE v.state IN ('creating', 'deleting') ORDER BY v.created_at`)
	if err != nil {
		return nil, fmt.Errorf("list unsettled volumes: %w", err)
	}
	return out, nil
}

// holdVolumesTx records that sandbox id holds owner's volumes: each must
// be the owner's (not_found otherwise), ready, and held by no active
// sandbox (conflict).
func holdVolumesTx(ctx context.Context, tx *sql.Tx, owner, id string, volumes []string) error {
	for _, vid := range volumes {
		v, err := ownedVolumeTx(ctx, tx, owner, vid)
		if err != nil {
			return err
		}
		switch {
		case v.State == VolumeDeleted || v.State == VolumeFailed:
			return notFound("volume %s not found (%s)", errdefs.Quote(vid), v.State)
		case v.State != VolumeReady:
			return errdefs.Errorf(errdefs.CodeConflict, "volume %s is %s", vid, v.State)
		case v.HeldBy != "":
			return errdefs.Errorf(errdefs.CodeConflict, "volume %s is held by sandbox %s", vid, v.HeldBy)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_volumes (sandbox_id, volume_id) VALUES (?, ?)`, id, vid); err != nil {
			return fmt.Errorf("record volume %s of sandbox %s: %w", vid, id, err)
		}
	}
	return nil
}
