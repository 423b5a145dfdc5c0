package blockstore

import (
	"context"
	"fmt"
)

// Fork makes dst a new volume whose generation 0 is src: a manifest with
// Parent = src and no entries, so it costs one object whatever the device
// size. dst gets its own data key; reads of the chunks it shares with src
// go through src's key (Open walks the chain across volumes), and dst's
// later generations write over dst@0 under dst's key, never touching src.
// It refuses (ErrExists) a dst that has any generation, head or tombstone,
// and a dst that is src's own volume. Fork does not publish a head: the
// caller does, with Publish(dst, Head{}, Head{Generation: 0, ...}).
//
// src must stay reachable until then: a fork of a root's generation (a
// head's chain, a snapshot, a template) is safe against a concurrent GC;
// dst@0 itself is kept by GC's grace until a head names it.
func (r *Repo) Fork(ctx context.Context, src GenRef, dst Volume) (*Manifest, error) {
	if err := dst.Check(); err != nil {
		return nil, fmt.Errorf("fork %s to %s: %w", src, dst, err)
	}
	if src.Volume == dst {
		return nil, fmt.Errorf("fork %s to %s: %w: a volume cannot be forked into itself", src, dst, ErrExists)
	}
	p, err := r.Open(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("fork %s to %s: %w", src, dst, err)
	}
	gens, err := r.Generations(ctx, dst)
	if err != nil {
		return nil, fmt.Errorf("fork %s to %s: %w", src, dst, err)
	}
	if len(gens) > 0 {
		return nil, fmt.Errorf("fork %s to %s: %w: %s has %d generations", src, dst, ErrExists, dst, len(gens))
	}
	seqs, err := r.headSeqs(ctx, dst)
	if err != nil {
		return nil, fmt.Errorf("fork %s to %s: %w", src, dst, err)
	}
	if len(seqs) > 0 {
		return nil, fmt.Errorf("fork %s to %s: %w: %s has a head", src, dst, ErrExists, dst)
	}
	if keys, err := r.store.List(ctx, tombstoneKey(dst)); err != nil {
		return nil, fmt.Errorf("fork %s to %s: %w", src, dst, err)
	} else if len(keys) > 0 {
		return nil, fmt.Errorf("fork %s to %s: %w: %s is deleted and not yet freed by GC", src, dst, ErrExists, dst)
	}
	srcRef := src
	m, err := r.Commit(ctx, CommitSpec{
		Generation: GenRef{Volume: dst, Generation: 0},
		Parent:     &srcRef,
		DeviceSize: p.DeviceSize(),
		ChunkSize:  uint32(p.ChunkSize()),
	}, nil)
	if err != nil {
		// Two forks into the same dst: generation 0's create-once
		// manifest lets one win; the other gets ErrExists here.
		return nil, fmt.Errorf("fork %s to %s: %w", src, dst, err)
	}
	return m, nil
}
