package blockstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Snapshot is a named root of a volume: a committed generation kept (from
// GC) until the snapshot is deleted.
type Snapshot struct {
	Name       string
	Generation uint64
}

// SnapshotNameRule is the snapshot name rule in words, for error messages.
const SnapshotNameRule = "1-128 bytes of A-Z a-z 0-9 . _ -, not starting with '.'"

// CheckSnapshotName checks name against SnapshotNameRule (a key segment:
// names become object keys).
func CheckSnapshotName(name string) error {
	if strings.Contains(name, "/") || CheckKey(name) != nil {
		return fmt.Errorf("%w: snapshot name %q: %s", ErrInvalidKey, name, SnapshotNameRule)
	}
	return nil
}

// Snapshot objects of a volume v: v/snap/<name>, sealed under v's data
// key, payload "CTBS" | version 1 | str volume | str name | u64 generation
// (volume and name repeated, so a copy under another name is ErrCorrupt).
const (
	snapMagic   = "CTBS"
	snapVersion = 1
)

func snapshotPrefix(v Volume) string { return v.String() + "/snap/" }

func snapshotKey(v Volume, name string) string { return snapshotPrefix(v) + name }

func encodeSnapshot(v Volume, s Snapshot) []byte {
	var e encoder
	e.raw([]byte(snapMagic))
	e.u8(snapVersion)
	e.str(v.String())
	e.str(s.Name)
	e.u64(s.Generation)
	return e.bytes()
}

func decodeSnapshot(v Volume, name string, b []byte) (Snapshot, error) {
	d := decoder{b: b}
	if string(d.raw(len(snapMagic))) != snapMagic || d.u8() != snapVersion {
		return Snapshot{}, errors.New("bad magic or version")
	}
	vol := d.str()
	s := Snapshot{Name: d.str(), Generation: d.u64()}
	if d.err != nil {
		return Snapshot{}, d.err
	}
	if d.rest() != 0 {
		return Snapshot{}, fmt.Errorf("%d trailing bytes", d.rest())
	}
	if vol != v.String() || s.Name != name {
		return Snapshot{}, fmt.Errorf("it is snapshot %q of %s", s.Name, vol)
	}
	return s, nil
}

// PutSnapshot names generation g of v (committed: its chain opens) as
// snapshot name. A taken name is ErrExists (snapshots are never
// overwritten); a deleted volume is ErrDeleted.
func (r *Repo) PutSnapshot(ctx context.Context, v Volume, name string, g uint64) error {
	if err := v.Check(); err != nil {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	if err := CheckSnapshotName(name); err != nil {
		return err
	}
	if deleted, err := r.deleted(ctx, v); err != nil {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	} else if deleted {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, ErrDeleted)
	}
	ref := GenRef{Volume: v, Generation: g}
	if _, err := r.Open(ctx, ref); err != nil {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	dk, err := r.keys.Get(ctx, v)
	if err != nil {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	key := snapshotKey(v, name)
	blob, err := r.codec.seal(dk, kindSnapshot, key, encodeSnapshot(v, Snapshot{Name: name, Generation: g}))
	if err != nil {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	if err := r.store.Put(ctx, key, blob); err != nil {
		return fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	return nil
}

// readSnapshot loads and authenticates snapshot name of v.
func (r *Repo) readSnapshot(ctx context.Context, v Volume, name string) (Snapshot, error) {
	key := snapshotKey(v, name)
	blob, err := r.store.Get(ctx, key)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	dk, err := r.keys.Get(ctx, v)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	payload, err := r.codec.open(dk, kindSnapshot, key, blob)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", name, v, err)
	}
	s, err := decodeSnapshot(v, name, payload)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s of %s: %w: %v", name, v, ErrCorrupt, err)
	}
	return s, nil
}

// Snapshots lists v's snapshots by name. A tampered snapshot object is
// ErrCorrupt.
func (r *Repo) Snapshots(ctx context.Context, v Volume) ([]Snapshot, error) {
	if err := v.Check(); err != nil {
		return nil, fmt.Errorf("snapshots of %s: %w", v, err)
	}
	keys, err := r.store.List(ctx, snapshotPrefix(v))
	if err != nil {
		return nil, fmt.Errorf("snapshots of %s: %w", v, err)
	}
	out := make([]Snapshot, 0, len(keys))
	for _, k := range keys {
		name := strings.TrimPrefix(k, snapshotPrefix(v))
		if CheckSnapshotName(name) != nil {
			return nil, fmt.Errorf("snapshots of %s: %w: stray object %s", v, ErrCorrupt, k)
		}
		s, err := r.readSnapshot(ctx, v, name)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the List
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteSnapshot removes snapshot name of v; a missing one is not an error
// (teardown is idempotent). GC then frees what only it kept.
func (r *Repo) DeleteSnapshot(ctx context.Context, v Volume, name string) error {
	if err := v.Check(); err != nil {
		return fmt.Errorf("delete snapshot %s of %s: %w", name, v, err)
	}
	if err := CheckSnapshotName(name); err != nil {
		return err
	}
	if err := r.store.Delete(ctx, snapshotKey(v, name)); err != nil {
		return fmt.Errorf("delete snapshot %s of %s: %w", name, v, err)
	}
	return nil
}
