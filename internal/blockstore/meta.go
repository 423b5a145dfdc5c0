package blockstore

import (
	"context"
	"errors"
	"fmt"
)

// MaxMetaBytes bounds a volume's metadata payload.
const MaxMetaBytes = 256 << 10

// The metadata object of a volume v: v/meta, sealed under v's data key
// (the AAD binds the key, so another volume's metadata copied here fails
// authentication). Its payload is the caller's (a template's image config
// and source): the store only authenticates it, so a bucket that is not
// trusted cannot change what a claim of the template runs. Created once,
// like every object; Remove of the template deletes it with the rest.
func metaKey(v Volume) string { return v.String() + "/meta" }

// PutMeta stores payload as v's metadata: ErrExists if v has some.
func (r *Repo) PutMeta(ctx context.Context, v Volume, payload []byte) error {
	if err := v.Check(); err != nil {
		return fmt.Errorf("put metadata of %s: %w", v, err)
	}
	if len(payload) > MaxMetaBytes {
		return fmt.Errorf("put metadata of %s: %d bytes, at most %d", v, len(payload), MaxMetaBytes)
	}
	dk, err := r.keys.Ensure(ctx, v)
	if err != nil {
		return fmt.Errorf("put metadata of %s: %w", v, err)
	}
	blob, err := r.codec.seal(dk, kindMeta, metaKey(v), payload)
	if err != nil {
		return fmt.Errorf("put metadata of %s: %w", v, err)
	}
	if err := r.store.Put(ctx, metaKey(v), blob); err != nil {
		return fmt.Errorf("put metadata of %s: %w", v, err)
	}
	return nil
}

// Meta returns v's metadata: an error wrapping ErrNotFound if it has none,
// ErrCorrupt if it fails authentication.
func (r *Repo) Meta(ctx context.Context, v Volume) ([]byte, error) {
	if err := v.Check(); err != nil {
		return nil, fmt.Errorf("read metadata of %s: %w", v, err)
	}
	blob, err := r.store.Get(ctx, metaKey(v))
	if err != nil {
		return nil, fmt.Errorf("read metadata of %s: %w", v, err)
	}
	dk, err := r.keys.Get(ctx, v)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			// A metadata object without the volume's key is not ours.
			return nil, fmt.Errorf("read metadata of %s: %w: no data key", v, ErrCorrupt)
		}
		return nil, fmt.Errorf("read metadata of %s: %w", v, err)
	}
	payload, err := r.codec.open(dk, kindMeta, metaKey(v), blob)
	if err != nil {
		return nil, fmt.Errorf("read metadata of %s: %w", v, err)
	}
	return payload, nil
}

// DeleteMeta removes v's metadata (idempotent): what an import that did
// not finish left.
func (r *Repo) DeleteMeta(ctx context.Context, v Volume) error {
	if err := r.store.Delete(ctx, metaKey(v)); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("delete metadata of %s: %w", v, err)
	}
	return nil
}
