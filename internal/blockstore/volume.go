package blockstore

import (
	"context"
	"errors"
	"fmt"
)

// ErrDeleted: the volume is deleted (DeleteVolume ran); it takes no new
// head or snapshot, and its ID is not reused until GC has freed it all.
var ErrDeleted = errors.New("volume deleted")

// The tombstone of a deleted volume v is v/deleted, sealed under v's data
// key, payload "CTBD" | version 1 | str volume. It is what takes a
// template's generations out of GC's roots, and what fences a Publish
// after the delete.
const (
	tombMagic   = "CTBD"
	tombVersion = 1
)

func tombstoneKey(v Volume) string { return v.String() + "/deleted" }

func encodeTombstone(v Volume) []byte {
	var e encoder
	e.raw([]byte(tombMagic))
	e.u8(tombVersion)
	e.str(v.String())
	return e.bytes()
}

// deleted reports whether v has a tombstone. One that fails
// authentication is an error, never an answer: GC would free the
// volume's data on it.
func (r *Repo) deleted(ctx context.Context, v Volume) (bool, error) {
	key := tombstoneKey(v)
	blob, err := r.store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tombstone of %s: %w", v, err)
	}
	dk, err := r.keys.Get(ctx, v)
	if errors.Is(err, ErrNotFound) {
		// GC removes the tombstone before the key; a key gone first
		// leaves nothing readable to protect.
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("tombstone of %s: %w", v, err)
	}
	payload, err := r.codec.open(dk, kindTombstone, key, blob)
	if err != nil {
		return false, fmt.Errorf("tombstone of %s: %w", v, err)
	}
	if string(payload) != string(encodeTombstone(v)) {
		return false, fmt.Errorf("tombstone of %s: %w: unexpected payload", v, ErrCorrupt)
	}
	return true, nil
}

// DeleteVolume deletes v: it writes v's tombstone (so v takes no new head
// or snapshot, and a template's generations stop being GC roots), then
// removes v's snapshots and heads (oldest head first, so a crash midway
// never makes an older head current). GC then frees whatever of v no
// other root reaches (a fork of v keeps what it shares). Idempotent.
func (r *Repo) DeleteVolume(ctx context.Context, v Volume) error {
	if err := v.Check(); err != nil {
		return fmt.Errorf("delete volume %s: %w", v, err)
	}
	dk, err := r.keys.Get(ctx, v)
	switch {
	case errors.Is(err, ErrNotFound):
		// No key, so nothing of v was ever committed or published in a
		// readable form; what is left below goes all the same.
	case err != nil:
		return fmt.Errorf("delete volume %s: %w", v, err)
	default:
		key := tombstoneKey(v)
		blob, err := r.codec.seal(dk, kindTombstone, key, encodeTombstone(v))
		if err != nil {
			return fmt.Errorf("delete volume %s: %w", v, err)
		}
		if err := r.store.Put(ctx, key, blob); err != nil && !errors.Is(err, ErrExists) {
			return fmt.Errorf("delete volume %s: tombstone: %w", v, err)
		}
	}
	for _, prefix := range []string{snapshotPrefix(v), headPrefix(v)} {
		keys, err := r.store.List(ctx, prefix)
		if err != nil {
			return fmt.Errorf("delete volume %s: %w", v, err)
		}
		for _, k := range keys { // sorted: heads oldest first
			if err := r.store.Delete(ctx, k); err != nil {
				return fmt.Errorf("delete volume %s: %w", v, err)
			}
		}
	}
	return nil
}
